"""cuBLAS's calls over the emulated driver's host buffers, with numpy, in cuBLAS's semantics.

Same methods and arguments as cublas.CublasHandle: column-major matrices with leading
dimensions, "N"/"T" operations, strides in floats, host scalars. As cuBLAS: C is not read when
beta is 0 (nor y in sgemv, nor B in sgeam), A not read in sgeam when alpha is 0; a negative
increment walks a vector backwards from its last element (sdot, saxpy, sgemv), and sasum and
sscal do nothing with one that is not positive (reference BLAS). Arguments cuBLAS would refuse
(CUBLAS_STATUS_INVALID_VALUE) raise DriverError; every operand must lie inside one allocation.
"""
import numpy as np
from numpy.lib.stride_tricks import as_strided

from .cublas import op
from .driver import DriverError

F32 = np.float32


class EmulatedBlas:
    def __init__(self, driver, stream=None):
        self.driver = driver
        self.stream = stream

    # -- operand views ---------------------------------------------------------------------
    def _matrix(self, ptr, rows, cols, ld):
        """The column-major rows x cols matrix at ``ptr`` with leading dimension ``ld``, as a
        (rows, cols) numpy view (writable)."""
        if rows == 0 or cols == 0:
            return np.zeros((rows, cols), F32)
        flat = self.driver.floats(ptr, (cols - 1) * ld + rows)
        return as_strided(flat, shape=(rows, cols), strides=(4, 4 * ld))

    def _vector(self, ptr, n, inc):
        if n == 0:
            return np.zeros(0, F32)
        step = abs(inc)
        flat = self.driver.floats(ptr, (n - 1) * step + 1)
        view = flat[::step]
        return view[::-1] if inc < 0 else view

    @staticmethod
    def _need(condition, call, what):
        if not condition:
            raise DriverError("%s: invalid value (%s), as cuBLAS would refuse it" % (call, what))

    def _gemm_views(self, call, transa, transb, m, n, k, a, lda, b, ldb, c, ldc, offsets=(0, 0, 0)):
        ta, tb = op(transa), op(transb)
        self._need(min(m, n, k) >= 0, call, "m, n, k = %d, %d, %d" % (m, n, k))
        a_rows, a_cols = (m, k) if ta == 0 else (k, m)
        b_rows, b_cols = (k, n) if tb == 0 else (n, k)
        self._need(lda >= max(1, a_rows), call, "lda %d < %d" % (lda, max(1, a_rows)))
        self._need(ldb >= max(1, b_rows), call, "ldb %d < %d" % (ldb, max(1, b_rows)))
        self._need(ldc >= max(1, m), call, "ldc %d < %d" % (ldc, max(1, m)))
        oa, ob, oc = offsets
        a_view = lambda: self._matrix(a + 4 * oa, a_rows, a_cols, lda)
        b_view = lambda: self._matrix(b + 4 * ob, b_rows, b_cols, ldb)
        c_view = self._matrix(c + 4 * oc, m, n, ldc)
        return ta, tb, a_view, b_view, c_view

    @staticmethod
    def _gemm_into(ta, tb, a_view, b_view, c_view, alpha, beta, k):
        if c_view.size == 0:
            return
        if k == 0 or alpha == 0:
            product = np.zeros(c_view.shape, F32)
        else:
            opa = a_view() if ta == 0 else a_view().T
            opb = b_view() if tb == 0 else b_view().T
            product = F32(alpha) * np.matmul(opa, opb, dtype=F32)
        if beta != 0:
            product += F32(beta) * c_view
        c_view[...] = product

    # -- the calls -------------------------------------------------------------------------
    def sgemm(self, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        ta, tb, av, bv, cv = self._gemm_views("sgemm", transa, transb, m, n, k, a, lda, b, ldb,
                                              c, ldc)
        self._gemm_into(ta, tb, av, bv, cv, alpha, beta, k)

    def sgemm_strided_batched(self, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb,
                              stride_b, beta, c, ldc, stride_c, batch):
        self._need(batch >= 0, "sgemmStridedBatched", "batch %d" % batch)
        for i in range(batch):
            ta, tb, av, bv, cv = self._gemm_views(
                "sgemmStridedBatched", transa, transb, m, n, k, a, lda, b, ldb, c, ldc,
                offsets=(i * stride_a, i * stride_b, i * stride_c))
            self._gemm_into(ta, tb, av, bv, cv, alpha, beta, k)

    def sgemv(self, trans, m, n, alpha, a, lda, x, incx, beta, y, incy):
        t = op(trans)
        self._need(m >= 0 and n >= 0, "sgemv", "m, n = %d, %d" % (m, n))
        self._need(lda >= max(1, m), "sgemv", "lda %d < %d" % (lda, max(1, m)))
        self._need(incx != 0 and incy != 0, "sgemv", "a zero increment")
        if m == 0 or n == 0:
            return
        x_len, y_len = (n, m) if t == 0 else (m, n)
        yv = self._vector(y, y_len, incy)
        if alpha == 0:
            product = np.zeros(y_len, F32)
        else:
            av = self._matrix(a, m, n, lda)
            product = F32(alpha) * np.matmul(av if t == 0 else av.T,
                                             self._vector(x, x_len, incx), dtype=F32)
        if beta != 0:
            product += F32(beta) * yv
        yv[...] = product

    def saxpy(self, n, alpha, x, incx, y, incy):
        if n <= 0:
            return
        self._need(incx != 0 and incy != 0, "saxpy", "a zero increment")
        yv = self._vector(y, n, incy)
        yv[...] = F32(alpha) * self._vector(x, n, incx) + yv

    def sscal(self, n, alpha, x, incx):
        if n <= 0 or incx <= 0:
            return
        xv = self._vector(x, n, incx)
        xv *= F32(alpha)

    def sdot(self, n, x, incx, y, incy):
        if n <= 0:
            return 0.0
        return float(np.dot(self._vector(x, n, incx), self._vector(y, n, incy)))

    def sasum(self, n, x, incx):
        if n <= 0 or incx <= 0:
            return 0.0
        return float(np.abs(self._vector(x, n, incx)).sum(dtype=F32))

    def sgeam(self, transa, transb, m, n, alpha, a, lda, beta, b, ldb, c, ldc):
        ta, tb = op(transa), op(transb)
        self._need(m >= 0 and n >= 0, "sgeam", "m, n = %d, %d" % (m, n))
        a_rows, a_cols = (m, n) if ta == 0 else (n, m)
        b_rows, b_cols = (m, n) if tb == 0 else (n, m)
        self._need(lda >= max(1, a_rows), "sgeam", "lda %d < %d" % (lda, max(1, a_rows)))
        self._need(ldb >= max(1, b_rows), "sgeam", "ldb %d < %d" % (ldb, max(1, b_rows)))
        self._need(ldc >= max(1, m), "sgeam", "ldc %d < %d" % (ldc, max(1, m)))
        if m == 0 or n == 0:
            return
        result = np.zeros((m, n), F32)
        if alpha != 0:
            av = self._matrix(a, a_rows, a_cols, lda)
            result += F32(alpha) * (av if ta == 0 else av.T)
        if beta != 0:
            bv = self._matrix(b, b_rows, b_cols, ldb)
            result += F32(beta) * (bv if tb == 0 else bv.T)
        self._matrix(c, m, n, ldc)[...] = result

    def close(self):
        pass
