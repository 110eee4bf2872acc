/* A stand-in libcublas.so.13 over the stand-in libcuda's memory (a device pointer is a host
 * address): the calls poseidon_caffe/backend/cuda/cublas.py binds, by plain loops that sum each
 * dot product in double and round it once.
 *
 * Compiled against the real cublas_api.h, so each definition has NVIDIA's prototype. cuBLAS's
 * argument rules, as the emulated BLAS keeps them:
 *  - CUBLAS_STATUS_INVALID_VALUE for a negative size, a leading dimension below the rows it
 *    holds (at least 1), a transpose other than N, T or C, a zero increment in sgemv and saxpy,
 *    a negative batch count, a null scalar, and sgeam in place other than cuBLAS allows;
 *  - C is not read when beta is 0 (nor y in sgemv, nor B in sgeam), A and B not when alpha is
 *    0 or k is 0;
 *  - a negative increment walks a vector backwards from its last element (sdot, saxpy, sgemv);
 *    sasum and sscal do nothing with one that is not positive.
 * With the stand-in libcuda loaded, every operand read or written must lie inside one of its
 * allocations: one that does not loses the device, as a GPU kernel reading outside memory
 * does (this call succeeds without computing, the CUDA calls after it fail with
 * CUDA_ERROR_ILLEGAL_ADDRESS; under CUDA_LAUNCH_BLOCKING=1 it fails itself), and a call on a
 * lost device fails with EXECUTION_FAILED.
 */
#define _GNU_SOURCE
#include <cublas_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

#define GO (-1)                         /* an operand check that lets the call go on */

struct cublasContext { cudaStream_t stream; };

typedef int (*operand_check)(uintptr_t p, size_t n, const char *call);

/* the stand-in libcuda's check, once it is loaded in the process */
static operand_check checker(void) {
    static operand_check found;
    if (!found) {
        void *libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (libcuda) found = (operand_check)dlsym(libcuda, "standin_cuda_operand");
    }
    return found;
}

/* GO, or the status to return at once: SUCCESS when the device faults now and the fault shows
 * in the CUDA calls after, as a faulting kernel's does; EXECUTION_FAILED when it had faulted
 * before, or under CUDA_LAUNCH_BLOCKING */
static int operand(const char *call, const float *p, size_t floats) {
    operand_check check = floats ? checker() : NULL;
    if (!check) return GO;
    switch (check((uintptr_t)p, floats * sizeof *p, call)) {
    case 0: return GO;
    case 1: return CUBLAS_STATUS_SUCCESS;
    default: return CUBLAS_STATUS_EXECUTION_FAILED;
    }
}
#define OPERAND(p, floats) do { int status_ = operand(__func__, (p), (floats)); \
                                if (status_ != GO) return status_; } while (0)
#define NEED(condition) do { if (!(condition)) return CUBLAS_STATUS_INVALID_VALUE; } while (0)
#define NEED_HANDLE(h) do { if (!(h)) return CUBLAS_STATUS_NOT_INITIALIZED; } while (0)

static size_t matrix_floats(int rows, int cols, int ld) {
    return rows > 0 && cols > 0 ? (size_t)(cols - 1) * ld + rows : 0;
}
static size_t vector_floats(int n, int inc) {
    return n > 0 ? (size_t)(n - 1) * (size_t)(inc < 0 ? -(long)inc : inc) + 1 : 0;
}
/* element i of a vector of n with increment inc (a negative one walks from the last) */
static long element(int n, int inc, int i) {
    return inc >= 0 ? (long)i * inc : (long)(n - 1 - i) * -(long)inc;
}
static int valid_op(cublasOperation_t op) {
    return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
}
static int at_least(int ld, int rows) { return ld >= (rows > 1 ? rows : 1); }
/* element (i, j) of op(A), A column-major with leading dimension ld */
static float at(const float *a, int ld, cublasOperation_t op, int i, int j) {
    return op == CUBLAS_OP_N ? a[i + (long)j * ld] : a[j + (long)i * ld];
}

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t *handle) {
    NEED(handle);
    *handle = calloc(1, sizeof **handle);
    return *handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}
cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
    NEED_HANDLE(handle);
    free(handle);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
    NEED_HANDLE(handle);
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t CUBLASWINAPI cublasGetVersion_v2(cublasHandle_t handle, int *version) {
    NEED_HANDLE(handle); NEED(version);
    *version = CUBLAS_VERSION;
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t gemm(const char *call, cublasOperation_t ta, cublasOperation_t tb,
                           int m, int n, int k, float alpha, const float *a, int lda,
                           const float *b, int ldb, float beta, float *c, int ldc) {
    int a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
    int b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
    int product = k > 0 && alpha != 0.0f;
    if (product) {
        int status = operand(call, a, matrix_floats(a_rows, a_cols, lda));
        if (status == GO) status = operand(call, b, matrix_floats(b_rows, b_cols, ldb));
        if (status != GO) return status;
    }
    int status = operand(call, c, matrix_floats(m, n, ldc));
    if (status != GO) return status;
    /* each output sums its k products in order, in double; the loops run along memory
     * (op(A) = A: down A's columns; op(A) = A^T: along them), as the tests' nets need */
    double *sums = calloc(m > 0 ? (size_t)m : 1, sizeof *sums);
    if (!sums) return CUBLAS_STATUS_ALLOC_FAILED;
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < m; i++) sums[i] = 0.0;
        if (product && ta == CUBLAS_OP_N) {
            for (int p = 0; p < k; p++) {
                const float *column = a + (long)p * lda;
                double factor = at(b, ldb, tb, p, j);
                for (int i = 0; i < m; i++) sums[i] += (double)column[i] * factor;
            }
        } else if (product) {
            for (int i = 0; i < m; i++) {
                const float *row = a + (long)i * lda;         /* row i of A^T */
                double sum = 0.0;
                for (int p = 0; p < k; p++) sum += (double)row[p] * at(b, ldb, tb, p, j);
                sums[i] = sum;
            }
        }
        for (int i = 0; i < m; i++) {
            float *out = &c[i + (long)j * ldc];
            float value = alpha * (float)sums[i];
            *out = beta == 0.0f ? value : value + beta * *out;
        }
    }
    free(sums);
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t gemm_arguments(cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                     int k, const float *alpha, int lda, int ldb,
                                     const float *beta, int ldc) {
    NEED(valid_op(ta) && valid_op(tb) && alpha && beta && m >= 0 && n >= 0 && k >= 0);
    NEED(at_least(lda, ta == CUBLAS_OP_N ? m : k) && at_least(ldb, tb == CUBLAS_OP_N ? k : n));
    NEED(at_least(ldc, m));
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t ta,
                                           cublasOperation_t tb, int m, int n, int k,
                                           const float *alpha, const float *a, int lda,
                                           const float *b, int ldb, const float *beta,
                                           float *c, int ldc) {
    NEED_HANDLE(handle);
    cublasStatus_t status = gemm_arguments(ta, tb, m, n, k, alpha, lda, ldb, beta, ldc);
    if (status != CUBLAS_STATUS_SUCCESS || m == 0 || n == 0) return status;
    return gemm(__func__, ta, tb, m, n, k, *alpha, a, lda, b, ldb, *beta, c, ldc);
}

cublasStatus_t CUBLASWINAPI cublasSgemmStridedBatched(
        cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
        const float *alpha, const float *a, int lda, long long int stride_a, const float *b,
        int ldb, long long int stride_b, const float *beta, float *c, int ldc,
        long long int stride_c, int batch) {
    NEED_HANDLE(handle);
    cublasStatus_t status = gemm_arguments(ta, tb, m, n, k, alpha, lda, ldb, beta, ldc);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    NEED(batch >= 0);
    for (int i = 0; i < batch && m > 0 && n > 0; i++) {
        status = gemm(__func__, ta, tb, m, n, k, *alpha, a + i * stride_a, lda,
                      b + i * stride_b, ldb, *beta, c + i * stride_c, ldc);
        if (status != CUBLAS_STATUS_SUCCESS) return status;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSgemv_v2(cublasHandle_t handle, cublasOperation_t trans,
                                           int m, int n, const float *alpha, const float *a,
                                           int lda, const float *x, int incx, const float *beta,
                                           float *y, int incy) {
    NEED_HANDLE(handle);
    NEED(valid_op(trans) && alpha && beta && m >= 0 && n >= 0 && at_least(lda, m));
    NEED(incx != 0 && incy != 0);
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    int rows = trans == CUBLAS_OP_N ? m : n, cols = trans == CUBLAS_OP_N ? n : m;
    if (*alpha != 0.0f) {
        OPERAND(a, matrix_floats(m, n, lda));
        OPERAND(x, vector_floats(cols, incx));
    }
    OPERAND(y, vector_floats(rows, incy));
    for (int i = 0; i < rows; i++) {
        double sum = 0.0;
        for (int j = 0; *alpha != 0.0f && j < cols; j++)
            sum += (double)at(a, lda, trans, i, j) * x[element(cols, incx, j)];
        float *out = &y[element(rows, incy, i)];
        float value = *alpha * (float)sum;
        *out = *beta == 0.0f ? value : value + *beta * *out;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSaxpy_v2(cublasHandle_t handle, int n, const float *alpha,
                                           const float *x, int incx, float *y, int incy) {
    NEED_HANDLE(handle); NEED(alpha);
    if (n <= 0) return CUBLAS_STATUS_SUCCESS;
    NEED(incx != 0 && incy != 0);
    OPERAND(x, vector_floats(n, incx));
    OPERAND(y, vector_floats(n, incy));
    for (int i = 0; i < n; i++) y[element(n, incy, i)] += *alpha * x[element(n, incx, i)];
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSscal_v2(cublasHandle_t handle, int n, const float *alpha,
                                           float *x, int incx) {
    NEED_HANDLE(handle); NEED(alpha);
    if (n <= 0 || incx <= 0) return CUBLAS_STATUS_SUCCESS;
    OPERAND(x, vector_floats(n, incx));
    for (int i = 0; i < n; i++) x[(long)i * incx] *= *alpha;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSdot_v2(cublasHandle_t handle, int n, const float *x, int incx,
                                          const float *y, int incy, float *result) {
    NEED_HANDLE(handle); NEED(result);
    *result = 0.0f;
    if (n <= 0) return CUBLAS_STATUS_SUCCESS;
    OPERAND(x, vector_floats(n, incx));
    OPERAND(y, vector_floats(n, incy));
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)x[element(n, incx, i)] * y[element(n, incy, i)];
    *result = (float)sum;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSasum_v2(cublasHandle_t handle, int n, const float *x, int incx,
                                           float *result) {
    NEED_HANDLE(handle); NEED(result);
    *result = 0.0f;
    if (n <= 0 || incx <= 0) return CUBLAS_STATUS_SUCCESS;
    OPERAND(x, vector_floats(n, incx));
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        float v = x[(long)i * incx];
        sum += v < 0 ? -v : v;
    }
    *result = (float)sum;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSgeam(cublasHandle_t handle, cublasOperation_t ta,
                                        cublasOperation_t tb, int m, int n, const float *alpha,
                                        const float *a, int lda, const float *beta,
                                        const float *b, int ldb, float *c, int ldc) {
    NEED_HANDLE(handle);
    NEED(valid_op(ta) && valid_op(tb) && alpha && beta && m >= 0 && n >= 0);
    int a_rows = ta == CUBLAS_OP_N ? m : n, a_cols = ta == CUBLAS_OP_N ? n : m;
    int b_rows = tb == CUBLAS_OP_N ? m : n, b_cols = tb == CUBLAS_OP_N ? n : m;
    NEED(at_least(lda, a_rows) && at_least(ldb, b_rows) && at_least(ldc, m));
    /* in place only as cuBLAS allows it: untransposed, with C's leading dimension */
    NEED(c != a || (ta == CUBLAS_OP_N && lda == ldc));
    NEED(c != b || (tb == CUBLAS_OP_N && ldb == ldc));
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    if (*alpha != 0.0f) OPERAND(a, matrix_floats(a_rows, a_cols, lda));
    if (*beta != 0.0f) OPERAND(b, matrix_floats(b_rows, b_cols, ldb));
    OPERAND(c, matrix_floats(m, n, ldc));
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float value = 0.0f;
            if (*alpha != 0.0f) value += *alpha * at(a, lda, ta, i, j);
            if (*beta != 0.0f) value += *beta * at(b, ldb, tb, i, j);
            c[i + (long)j * ldc] = value;
        }
    return CUBLAS_STATUS_SUCCESS;
}
