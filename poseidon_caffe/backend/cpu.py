"""The numpy backend: float32 arrays in host memory, every op vectorised over the whole batch."""
import numpy as np


class CPUBackend:
    name = "cpu"
    xp = np                    # the array namespace layers use for light elementwise work
    dtype = np.float32

    # -- memory ----------------------------------------------------------------------------
    def zeros(self, shape, dtype=None):
        return np.zeros(shape, dtype=dtype or self.dtype)

    def empty(self, shape, dtype=None):
        return np.empty(shape, dtype=dtype or self.dtype)

    def to_device(self, array, dtype=None):
        return np.ascontiguousarray(array, dtype=dtype or self.dtype)

    def to_host(self, array):
        return np.asarray(array)

    # -- BLAS ------------------------------------------------------------------------------
    def gemm(self, a, b, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, out=None):
        """out = alpha * op(a) @ op(b) + beta * out."""
        a = a.T if trans_a else a
        b = b.T if trans_b else b
        if out is None or beta == 0.0:
            result = a @ b
            if alpha != 1.0:
                result *= alpha
            if out is None:
                return result
            out[...] = result
            return out
        out *= beta
        out += (a @ b) * alpha if alpha != 1.0 else a @ b
        return out

    def axpy(self, alpha, x, y):
        """y += alpha * x."""
        if alpha == 1.0:
            y += x
        else:
            y += alpha * x
        return y

    def dot(self, x, y):
        return float(np.dot(x.ravel(), y.ravel()))

    def asum(self, x):
        return float(np.abs(x).sum(dtype=np.float64))

    def sumsq(self, x):
        x = x.ravel()
        return float(np.dot(x, x))
