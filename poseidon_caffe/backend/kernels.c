/* Compiled passes for the CPU backend, where numpy would need several strided passes or
 * copies: 2-D MAX and AVE pooling, forward and backward, over planes of (height, width).
 *
 * Built at install as the extension module poseidon_caffe.backend._kernels (optional:
 * without a compiler the numpy paths run). The module itself is empty; native.py calls the
 * functions below through ctypes, which releases the GIL, so the batch parts of split.py run
 * side by side. The functions only read and write the C-contiguous float32 arrays they are
 * handed.
 *
 * The window rules are Caffe's (pooling_layer.cpp): MAX ignores padding and an empty window
 * gives -FLT_MAX and index -1; AVE sums the window clipped to the input and divides by its
 * size clipped to input + padding, in Caffe's order of summation.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The version of the functions' signatures below and in lrn.c (raise it with any change to
 * one); native.py refuses a library built from another version (an in-place build older
 * than this source). */
int kernels_version(void)
{
    return 3;
}

/* One axis of a pooling: where output o's window starts and ends, clipped to the input. */
static void window(int o, int stride, int pad, int kernel, int size, int *start, int *end)
{
    int s = o * stride - pad;
    int e = s + kernel;
    *start = s < 0 ? 0 : s;
    *end = e > size ? size : e;
}

/* The outputs [*lo, *hi) of a row whose window has column tap t inside the input:
 * 0 <= j * stride - pad + t < size. */
static void tap_outputs(int t, int stride, int pad, int size, int outputs, int *lo, int *hi)
{
    int first = pad - t;                    /* j * stride >= pad - t */
    int l = first <= 0 ? 0 : (first + stride - 1) / stride;
    int last = size - 1 + pad - t;          /* j * stride <= size - 1 + pad - t */
    int h = last < 0 ? 0 : last / stride + 1;
    *lo = l;
    *hi = h < outputs ? h : outputs;
}

/* For n cells: where g[q] (flat index idx[q], or base + q when idx is NULL) is greater than
 * best[q], it becomes best[q] and its index at[q]; a NaN becomes best[q] (and stays: no value
 * is greater than NaN) but not its index. Masks, not branches, so the loop runs on vectors. */
static inline void take_greater(const float *restrict g, const int32_t *restrict idx, int n,
                                float *restrict best, int32_t *restrict at)
{
    for (int q = 0; q < n; ++q) {
        float value = g[q];
        int32_t greater = -(int32_t)(value > best[q]);
        best[q] = (value > best[q]) | (value != value) ? value : best[q];
        at[q] = (at[q] & ~greater) | (idx[q] & greater);
    }
}

/* y = the maximum of each window; arg = flat index (u * w + v) of the first maximum in
 * row-major order (a later cell takes over only when strictly greater), -1 for an empty
 * window. A NaN in a window makes its output NaN, as numpy's maximum does.
 *
 * Two stages per plane, each a few long loops over whole planes rather than one short loop
 * per window (which cell wins is data, which a branch predictor cannot learn, and the running
 * maximum of one window is a chain of dependent steps): along the rows, every input row's
 * maximum per output column, kept with its index; then along the columns, the first row
 * whose maximum is strictly greater. A cell tap t of column j reads is gathered for the
 * whole plane at once, -inf where the window has no such cell, so the comparison loops run
 * on vectors. -1: out of memory. */
int pool_max_forward(const float *restrict x, float *restrict y, int32_t *restrict arg,
                     int64_t planes, int h, int w, int oh, int ow, int kh, int kw, int sh,
                     int sw, int ph, int pw)
{
    size_t cells = (size_t)h * ow;
    float *g = malloc(sizeof(float) * cells);          /* one tap's cells, whole plane */
    float *plane = malloc(sizeof(float) * ((size_t)h * w + 1));  /* + a -inf cell */
    float *rm = malloc(sizeof(float) * cells);         /* row maxima */
    int32_t *ra = malloc(sizeof(int32_t) * cells);     /* and where they are */
    int32_t *src = malloc(sizeof(int32_t) * cells * (size_t)kw);   /* tap t reads src */
    int *start = malloc(sizeof(int) * (size_t)ow);
    if (g == NULL || plane == NULL || rm == NULL || ra == NULL || src == NULL ||
            start == NULL) {
        free(g);
        free(plane);
        free(rm);
        free(ra);
        free(src);
        free(start);
        return -1;
    }
    /* per call: each column's first cell (-1: none) and the flat cell tap t reads for
     * (row u, column j), -1 where that window has no such cell; the copy of a plane has a
     * -inf cell past its end for those, so the gather needs no test */
    int32_t none = h * w;
    plane[none] = -INFINITY;
    for (int j = 0; j < ow; ++j) {
        int ws, we;
        window(j, sw, pw, kw, w, &ws, &we);
        start[j] = ws < we ? ws : -1;
    }
    for (int t = 0; t < kw; ++t) {
        for (int u = 0; u < h; ++u) {
            for (int j = 0; j < ow; ++j) {
                int v = j * sw + t - pw;
                src[(size_t)t * cells + (size_t)u * ow + j] = v >= 0 && v < w ? u * w + v : none;
            }
        }
    }
    for (int64_t p = 0; p < planes; ++p) {
        const float *xp = x + p * (int64_t)h * w;
        float *yp = y + p * (int64_t)oh * ow;
        int32_t *ap = arg + p * (int64_t)oh * ow;
        memcpy(plane, xp, sizeof(float) * (size_t)none);
        /* along the rows: start from each window's first cell, then every tap */
        for (int u = 0; u < h; ++u) {
            for (int j = 0; j < ow; ++j) {
                int first = start[j];
                rm[u * ow + j] = first < 0 ? -FLT_MAX : xp[u * w + (first < 0 ? 0 : first)];
                ra[u * ow + j] = first < 0 ? -1 : u * w + first;
            }
        }
        for (int t = 0; t < kw; ++t) {
            const int32_t *st = src + (size_t)t * cells;
            for (size_t q = 0; q < cells; ++q)
                g[q] = plane[st[q]];
            take_greater(g, st, (int)cells, rm, ra);
        }
        /* along the columns: the first row of the window, then a row that is greater */
        for (int i = 0; i < oh; ++i) {
            int hs, he;
            window(i, sh, ph, kh, h, &hs, &he);
            float *yr = yp + i * ow;
            int32_t *ar = ap + i * ow;
            if (hs >= he) {
                for (int j = 0; j < ow; ++j) {
                    yr[j] = -FLT_MAX;
                    ar[j] = -1;
                }
                continue;
            }
            memcpy(yr, rm + hs * ow, sizeof(float) * (size_t)ow);
            memcpy(ar, ra + hs * ow, sizeof(int32_t) * (size_t)ow);
            for (int u = hs + 1; u < he; ++u)
                take_greater(rm + u * ow, ra + u * ow, ow, yr, ar);
        }
    }
    free(g);
    free(plane);
    free(rm);
    free(ra);
    free(src);
    free(start);
    return 0;
}

/* dx = each dy added at its window's winner (arg from pool_max_forward; -1 routes nowhere). */
void pool_max_backward(const float *restrict dy, const int32_t *restrict arg,
                       float *restrict dx, int64_t planes,
                       int in_count, int out_count)
{
    memset(dx, 0, sizeof(float) * (size_t)(planes * in_count));
    for (int64_t p = 0; p < planes; ++p) {
        const float *dyp = dy + p * out_count;
        const int32_t *ap = arg + p * out_count;
        float *dxp = dx + p * in_count;
        for (int o = 0; o < out_count; ++o) {
            if (ap[o] >= 0)
                dxp[ap[o]] += dyp[o];
        }
    }
}

/* Caffe's AVE divisor on one axis: the window clipped to input + padding, before clipping to
 * the input. */
static int padded_extent(int o, int stride, int pad, int kernel, int size)
{
    int s = o * stride - pad;
    int e = s + kernel;
    if (e > size + pad)
        e = size + pad;
    return e - s;
}

/* y = the window sum (row-major order, as Caffe adds) divided by Caffe's window size; the
 * outputs of a row are summed together, one window cell at a time. -1: out of memory. */
int pool_ave_forward(const float *restrict x, float *restrict y, int64_t planes, int h,
                     int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph, int pw)
{
    float *sum = malloc(sizeof(float) * (size_t)ow);
    if (sum == NULL)
        return -1;
    for (int64_t p = 0; p < planes; ++p) {
        const float *xp = x + p * (int64_t)h * w;
        float *yp = y + p * (int64_t)oh * ow;
        for (int i = 0; i < oh; ++i) {
            int hs, he;
            int rows = padded_extent(i, sh, ph, kh, h);
            window(i, sh, ph, kh, h, &hs, &he);
            for (int j = 0; j < ow; ++j)
                sum[j] = 0.0f;
            for (int u = hs; u < he; ++u) {
                const float *row = xp + u * w;
                for (int t = 0; t < kw; ++t) {
                    int lo, hi;
                    tap_outputs(t, sw, pw, w, ow, &lo, &hi);
                    const float *cell = row + t - pw;
                    for (int j = lo; j < hi; ++j)
                        sum[j] += cell[j * sw];
                }
            }
            float *yr = yp + i * ow;
            for (int j = 0; j < ow; ++j)
                yr[j] = sum[j] / (rows * padded_extent(j, sw, pw, kw, w));
        }
    }
    free(sum);
    return 0;
}

/* dx = each dy divided by its window's size, added over the window's cells. -1: out of
 * memory. */
int pool_ave_backward(const float *restrict dy, float *restrict dx, int64_t planes, int h,
                      int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph, int pw)
{
    float *share = malloc(sizeof(float) * (size_t)ow);
    if (share == NULL)
        return -1;
    memset(dx, 0, sizeof(float) * (size_t)(planes * h * w));
    for (int64_t p = 0; p < planes; ++p) {
        const float *dyp = dy + p * (int64_t)oh * ow;
        float *dxp = dx + p * (int64_t)h * w;
        for (int i = 0; i < oh; ++i) {
            int hs, he;
            int rows = padded_extent(i, sh, ph, kh, h);
            window(i, sh, ph, kh, h, &hs, &he);
            for (int j = 0; j < ow; ++j)
                share[j] = dyp[i * ow + j] / (rows * padded_extent(j, sw, pw, kw, w));
            for (int u = hs; u < he; ++u) {
                float *row = dxp + u * w;
                /* taps last to first: a cell then gets its windows' shares in their
                 * row-major order, the order of Caffe's loop over the outputs */
                for (int t = kw - 1; t >= 0; --t) {
                    int lo, hi;
                    tap_outputs(t, sw, pw, w, ow, &lo, &hi);
                    float *cell = row + t - pw;
                    for (int j = lo; j < hi; ++j)
                        cell[j * sw] += share[j];
                }
            }
        }
    }
    free(share);
    return 0;
}

/* An importable module, so that the import system finds the library (editable installs
 * included); it has no Python functions of its own. */
static struct PyModuleDef kernels_module = {
    PyModuleDef_HEAD_INIT, "_kernels", "Pooling passes called through ctypes (native.py).",
    -1, NULL, NULL, NULL, NULL, NULL
};

PyMODINIT_FUNC PyInit__kernels(void)
{
    return PyModule_Create(&kernels_module);
}
