"""A thin ctypes binding of the cuBLAS calls the backend needs, with cuBLAS's own semantics.

Matrices are column-major with a leading dimension, as in cuBLAS: element (i, j) of an m x n
matrix at ``ptr`` is the float at ``ptr + 4 * (i + j * ld)``. ``trans`` arguments are "N" or
"T". Scalars are passed from the host (cuBLAS's default pointer mode); sdot and sasum return a
Python float. One handle serves one device and one stream (``Driver.blas(stream)``).

The library is the toolkit's (CUDA_HOME, CUDA_PATH, /usr/local/cuda), else the one in NVIDIA's
wheels (``nvidia-cublas`` for CUDA 13, ``nvidia-cublas-cu12``), else the loader's, the newest
major the driver runs; POSEIDON_CAFFE_CUBLAS names one explicitly.
The emulated driver's EmulatedBlas has the same methods over host buffers (numpy).
"""
import ctypes

from . import libraries
from .driver import DriverError

OPS = {"N": 0, "T": 1}
STATUS = {0: "CUBLAS_STATUS_SUCCESS", 1: "CUBLAS_STATUS_NOT_INITIALIZED",
          3: "CUBLAS_STATUS_ALLOC_FAILED", 7: "CUBLAS_STATUS_INVALID_VALUE",
          8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
          13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR",
          15: "CUBLAS_STATUS_NOT_SUPPORTED", 16: "CUBLAS_STATUS_LICENSE_ERROR"}

_h, _i, _p, _f = ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float)
_ll = ctypes.c_longlong
# every function of the binding: its exported name and parameter types
SIGNATURES = {
    "cublasCreate_v2": [ctypes.POINTER(_h)],
    "cublasDestroy_v2": [_h],
    "cublasSetStream_v2": [_h, _p],
    "cublasGetVersion_v2": [_h, ctypes.POINTER(_i)],
    "cublasSgemm_v2": [_h, _i, _i, _i, _i, _i, _f, _p, _i, _p, _i, _f, _p, _i],
    "cublasSgemmStridedBatched": [_h, _i, _i, _i, _i, _i, _f, _p, _i, _ll, _p, _i, _ll, _f, _p,
                                  _i, _ll, _i],
    "cublasSgemv_v2": [_h, _i, _i, _i, _f, _p, _i, _p, _i, _f, _p, _i],
    "cublasSaxpy_v2": [_h, _i, _f, _p, _i, _p, _i],
    "cublasSscal_v2": [_h, _i, _f, _p, _i],
    "cublasSdot_v2": [_h, _i, _p, _i, _p, _i, _f],
    "cublasSasum_v2": [_h, _i, _p, _i, _f],
    "cublasSgeam": [_h, _i, _i, _i, _i, _f, _p, _i, _f, _p, _i, _p, _i],
}


def op(trans):
    """cuBLAS's operation code of "N" or "T"."""
    try:
        return OPS[str(trans).upper()]
    except KeyError:
        raise DriverError("a BLAS transpose is 'N' or 'T', not %r" % (trans,)) from None


def load_library(max_major=None):
    """libcublas (not above CUDA ``max_major``) as a ctypes library with the binding's
    argument types set."""
    try:
        lib = libraries.load("cublas", "POSEIDON_CAFFE_CUBLAS", "cuBLAS", wheel_first=False,
                             max_major=max_major)
    except OSError as exc:
        raise DriverError(str(exc)) from None
    missing = [name for name in SIGNATURES if not hasattr(lib, name)]
    if missing:
        raise DriverError("the cuBLAS library %s lacks %s" % (lib._name, ", ".join(missing)))
    for name, argtypes in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    return lib


_library = []


def library(max_major=None):
    """The process's cuBLAS, loaded by the first driver that asks."""
    if not _library:
        _library.append(load_library(max_major))
    return _library[0]


def _ref(value):
    return ctypes.byref(ctypes.c_float(value))


class CublasHandle:
    """A cuBLAS handle on the current context, bound to ``stream`` (None: the default one)."""

    def __init__(self, stream=None, driver=None):
        self.driver = driver             # told of the host's waits for a scalar result
        self.stream = stream
        version = getattr(driver, "driver_version", 0)
        self.lib = library(version // 1000 if version else None)
        self.handle = ctypes.c_void_p()
        self._check(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        if stream is not None:
            self._check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream.handle)),
                        "cublasSetStream")

    def _check(self, status, call):
        if status != 0:
            raise DriverError("%s failed: %s" % (call, STATUS.get(status, "status %d" % status)))

    def close(self):
        if self.handle:
            self.lib.cublasDestroy_v2(self.handle)
            self.handle = ctypes.c_void_p()

    def version(self):
        v = ctypes.c_int()
        self._check(self.lib.cublasGetVersion_v2(self.handle, ctypes.byref(v)), "cublasGetVersion")
        return v.value

    def sgemm(self, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        """C (m x n) = alpha op(A) op(B) + beta C; C is not read when beta is 0."""
        self._check(self.lib.cublasSgemm_v2(self.handle, op(transa), op(transb), m, n, k,
                                            _ref(alpha), a, lda, b, ldb, _ref(beta), c, ldc),
                    "cublasSgemm")

    def sgemm_strided_batched(self, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb,
                              stride_b, beta, c, ldc, stride_c, batch):
        """sgemm on ``batch`` matrices, the i-th at ptr + 4 * i * stride (strides in floats)."""
        self._check(self.lib.cublasSgemmStridedBatched(
            self.handle, op(transa), op(transb), m, n, k, _ref(alpha), a, lda, stride_a, b, ldb,
            stride_b, _ref(beta), c, ldc, stride_c, batch), "cublasSgemmStridedBatched")

    def sgemv(self, trans, m, n, alpha, a, lda, x, incx, beta, y, incy):
        """y = alpha op(A) x + beta y, A m x n."""
        self._check(self.lib.cublasSgemv_v2(self.handle, op(trans), m, n, _ref(alpha), a, lda,
                                            x, incx, _ref(beta), y, incy), "cublasSgemv")

    def saxpy(self, n, alpha, x, incx, y, incy):
        self._check(self.lib.cublasSaxpy_v2(self.handle, n, _ref(alpha), x, incx, y, incy),
                    "cublasSaxpy")

    def sscal(self, n, alpha, x, incx):
        self._check(self.lib.cublasSscal_v2(self.handle, n, _ref(alpha), x, incx), "cublasSscal")

    def _host_result(self):
        if self.driver is not None:
            self.driver.count_host_sync()

    def sdot(self, n, x, incx, y, incy):
        self._host_result()
        out = ctypes.c_float()
        self._check(self.lib.cublasSdot_v2(self.handle, n, x, incx, y, incy, ctypes.byref(out)),
                    "cublasSdot")
        return out.value

    def sasum(self, n, x, incx):
        self._host_result()
        out = ctypes.c_float()
        self._check(self.lib.cublasSasum_v2(self.handle, n, x, incx, ctypes.byref(out)),
                    "cublasSasum")
        return out.value

    def sgeam(self, transa, transb, m, n, alpha, a, lda, beta, b, ldb, c, ldc):
        """C (m x n) = alpha op(A) + beta op(B) (a transpose when B is not read)."""
        self._check(self.lib.cublasSgeam(self.handle, op(transa), op(transb), m, n, _ref(alpha),
                                         a, lda, _ref(beta), b, ldb, c, ldc), "cublasSgeam")
