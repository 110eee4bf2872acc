"""The test driver's BLAS (the emulated one, or cuBLAS under --gpu-driver) against numpy, call
by call, in cuBLAS's column-major semantics: leading dimensions larger than the rows,
transposes, batch strides, increments (negative too), beta 0 not reading C, and the arguments
cuBLAS refuses."""
import itertools

import numpy as np
import pytest

from emulated_device import driver_under_test
from poseidon_caffe.backend.cuda.choice import open_driver
from poseidon_caffe.backend.cuda.driver import DriverError

RNG = np.random.default_rng(7)


@pytest.fixture
def dev():
    d = open_driver(driver_under_test())
    yield d
    d.close()


def _put(dev, array):
    array = np.ascontiguousarray(array, np.float32)
    ptr = dev.alloc(array.nbytes)
    dev.copy_htod(ptr, array)
    return ptr


def _get(dev, ptr, n):
    out = np.empty(n, np.float32)
    dev.copy_dtoh(out, ptr)
    return out


def _column_major(buf, rows, cols, ld, offset=0):
    """The rows x cols matrix stored column-major in the flat ``buf``: column j at
    offset + j * ld (read with reshape, independently of the emulation's strided views)."""
    padded = np.concatenate([buf[offset:], np.zeros(ld * cols, np.float32)])[:ld * cols]
    return padded.reshape(cols, ld).T[:rows]


def _buffer(rows, cols, ld, extra=0):
    return RNG.standard_normal(ld * (cols - 1) + rows + extra).astype(np.float32)


@pytest.mark.parametrize("ta,tb", list(itertools.product("NT", "NT")))
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_sgemm_with_transposes_and_padded_leading_dimensions(dev, ta, tb, beta):
    m, n, k = 3, 4, 5
    a_rows, a_cols = (m, k) if ta == "N" else (k, m)
    b_rows, b_cols = (k, n) if tb == "N" else (n, k)
    lda, ldb, ldc = a_rows + 2, b_rows + 1, m + 3
    a, b, c = _buffer(a_rows, a_cols, lda), _buffer(b_rows, b_cols, ldb), _buffer(m, n, ldc)
    if beta == 0:
        c[:] = np.nan                         # not read when beta is 0
    pa, pb, pc = _put(dev, a), _put(dev, b), _put(dev, c)
    dev.blas().sgemm(ta, tb, m, n, k, 1.5, pa, lda, pb, ldb, beta, pc, ldc)
    A = _column_major(a, a_rows, a_cols, lda)
    B = _column_major(b, b_rows, b_cols, ldb)
    opa, opb = (A if ta == "N" else A.T), (B if tb == "N" else B.T)
    expected = 1.5 * opa.astype(np.float64) @ opb
    if beta:
        expected += beta * _column_major(c, m, n, ldc)
    out = _get(dev, pc, c.size)
    np.testing.assert_allclose(_column_major(out, m, n, ldc), expected, rtol=1e-5, atol=1e-5)
    # the padding between columns of C is left alone
    untouched = np.ones(c.size, bool)
    for j in range(n):
        untouched[j * ldc:j * ldc + m] = False
    np.testing.assert_array_equal(out[untouched], c[untouched])


def test_sgemm_row_major_product_by_the_usual_swap(dev):
    """Row-major C = A B is column-major C^T = B^T A^T: the call Caffe's caffe_gpu_gemm makes."""
    a = RNG.standard_normal((3, 5)).astype(np.float32)
    b = RNG.standard_normal((5, 4)).astype(np.float32)
    pa, pb, pc = _put(dev, a), _put(dev, b), dev.alloc(48)
    dev.blas().sgemm("N", "N", 4, 3, 5, 1.0, pb, 4, pa, 5, 0.0, pc, 4)
    np.testing.assert_allclose(_get(dev, pc, 12).reshape(3, 4), a @ b, rtol=1e-5)


@pytest.mark.parametrize("ta,tb", [("N", "N"), ("T", "N"), ("N", "T")])
def test_sgemm_strided_batched(dev, ta, tb):
    m, n, k, batch = 2, 3, 4, 3
    a_rows, a_cols = (m, k) if ta == "N" else (k, m)
    b_rows, b_cols = (k, n) if tb == "N" else (n, k)
    lda, ldb, ldc = a_rows + 1, b_rows, m + 1
    sa, sb, sc = lda * a_cols + 3, ldb * b_cols + 1, ldc * n + 2      # gaps between matrices
    a = RNG.standard_normal(sa * batch).astype(np.float32)
    b = RNG.standard_normal(sb * batch).astype(np.float32)
    c = RNG.standard_normal(sc * batch).astype(np.float32)
    pa, pb, pc = _put(dev, a), _put(dev, b), _put(dev, c)
    dev.blas().sgemm_strided_batched(ta, tb, m, n, k, 2.0, pa, lda, sa, pb, ldb, sb, 1.0, pc,
                                     ldc, sc, batch)
    out = _get(dev, pc, c.size)
    for i in range(batch):
        A = _column_major(a, a_rows, a_cols, lda, i * sa)
        B = _column_major(b, b_rows, b_cols, ldb, i * sb)
        expected = 2.0 * (A if ta == "N" else A.T) @ (B if tb == "N" else B.T) + \
            _column_major(c, m, n, ldc, i * sc)
        np.testing.assert_allclose(_column_major(out, m, n, ldc, i * sc), expected, rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize("trans", "NT")
@pytest.mark.parametrize("incx,incy", [(1, 1), (2, 3), (-1, 2)])
def test_sgemv_with_increments(dev, trans, incx, incy):
    m, n, lda = 4, 3, 6
    a = _buffer(m, n, lda)
    x_len, y_len = (n, m) if trans == "N" else (m, n)
    x = RNG.standard_normal(x_len * abs(incx)).astype(np.float32)
    y = RNG.standard_normal(y_len * abs(incy)).astype(np.float32)
    pa, px, py = _put(dev, a), _put(dev, x), _put(dev, y)
    dev.blas().sgemv(trans, m, n, 0.5, pa, lda, px, incx, 2.0, py, incy)
    A = _column_major(a, m, n, lda)
    xs = x[::abs(incx)][:x_len]
    xs = xs[::-1] if incx < 0 else xs            # a negative increment walks backwards
    expected_y = y.copy()
    expected_y[::incy][:y_len] = 0.5 * (A if trans == "N" else A.T) @ xs + \
        2.0 * y[::incy][:y_len]
    np.testing.assert_allclose(_get(dev, py, y.size), expected_y, rtol=1e-5, atol=1e-6)


def test_sgemv_beta_zero_does_not_read_y(dev):
    a = RNG.standard_normal(6).astype(np.float32)
    pa, px = _put(dev, a), _put(dev, np.ones(3, np.float32))
    py = _put(dev, np.full(2, np.nan, np.float32))
    dev.blas().sgemv("N", 2, 3, 1.0, pa, 2, px, 1, 0.0, py, 1)
    np.testing.assert_allclose(_get(dev, py, 2), a.reshape(3, 2).sum(axis=0), rtol=1e-6)


def test_level_one_calls(dev):
    blas = dev.blas()
    x = RNG.standard_normal(9).astype(np.float32)
    y = RNG.standard_normal(9).astype(np.float32)
    px, py = _put(dev, x), _put(dev, y)
    blas.saxpy(3, 2.0, px, 3, py, 2)                   # y[0,2,4] += 2 x[0,3,6]
    expected = y.copy()
    expected[0:6:2] += 2 * x[0:9:3]
    np.testing.assert_allclose(_get(dev, py, 9), expected, rtol=1e-6)
    assert blas.sdot(3, px, 3, py, 2) == pytest.approx(float(x[0:9:3] @ expected[0:6:2]),
                                                       rel=1e-5)
    assert blas.sdot(3, px, -3, py, 1) == pytest.approx(float(x[0:9:3][::-1] @ expected[:3]),
                                                        rel=1e-5)
    assert blas.sasum(5, px, 2) == pytest.approx(float(np.abs(x[0:10:2]).sum()), rel=1e-6)
    assert blas.sasum(5, px, -1) == 0.0 and blas.sasum(0, px, 1) == 0.0
    blas.sscal(4, -0.5, px, 2)
    expected_x = x.copy()
    expected_x[0:8:2] *= -0.5
    np.testing.assert_array_equal(_get(dev, px, 9), expected_x)
    blas.saxpy(3, 1.0, px, -1, py, 1)                  # backwards through x
    expected[:3] += expected_x[:3][::-1]
    np.testing.assert_allclose(_get(dev, py, 9), expected, rtol=1e-6)


@pytest.mark.parametrize("ta,tb", list(itertools.product("NT", "NT")))
def test_sgeam(dev, ta, tb):
    m, n = 3, 4
    a_rows, a_cols = (m, n) if ta == "N" else (n, m)
    b_rows, b_cols = (m, n) if tb == "N" else (n, m)
    lda, ldb, ldc = a_rows + 1, b_rows + 2, m + 1
    a, b, c = _buffer(a_rows, a_cols, lda), _buffer(b_rows, b_cols, ldb), _buffer(m, n, ldc)
    pa, pb, pc = _put(dev, a), _put(dev, b), _put(dev, c)
    dev.blas().sgeam(ta, tb, m, n, 2.0, pa, lda, -1.0, pb, ldb, pc, ldc)
    A = _column_major(a, a_rows, a_cols, lda)
    B = _column_major(b, b_rows, b_cols, ldb)
    expected = 2 * (A if ta == "N" else A.T) - (B if tb == "N" else B.T)
    np.testing.assert_allclose(_column_major(_get(dev, pc, c.size), m, n, ldc), expected,
                               rtol=1e-6, atol=1e-6)


def test_sgeam_transposes_in_place_of_a_copy_and_skips_b_at_beta_zero(dev):
    a = RNG.standard_normal((2, 5)).astype(np.float32)     # row-major 2 x 5
    pa, pc = _put(dev, a), dev.alloc(40)
    pb = _put(dev, np.full(10, np.nan, np.float32))
    # column-major 5 x 2 with ld 5 is a; its transpose (2 x 5, ld 2) is a.T row-major
    dev.blas().sgeam("T", "N", 2, 5, 1.0, pa, 5, 0.0, pb, 2, pc, 2)
    np.testing.assert_array_equal(_get(dev, pc, 10).reshape(5, 2), a.T)


def test_arguments_cublas_refuses(dev):
    blas = dev.blas()
    p = _put(dev, np.zeros(64, np.float32))
    refused = "INVALID_VALUE"                   # cuBLAS's status; the emulation says more
    with pytest.raises(DriverError, match="lda 1 < 2|" + refused):
        blas.sgemm("N", "N", 2, 2, 2, 1.0, p, 1, p, 2, 0.0, p, 2)
    with pytest.raises(DriverError, match="ldc|" + refused):
        blas.sgemm("N", "N", 3, 2, 2, 1.0, p, 3, p, 2, 0.0, p, 2)
    with pytest.raises(DriverError, match="'N' or 'T'"):
        blas.sgemv("X", 2, 2, 1.0, p, 2, p, 1, 0.0, p, 1)


@pytest.mark.emulation_only
def test_the_emulation_names_what_cublas_would_refuse_or_fault_on(dev):
    blas = dev.blas()
    p = _put(dev, np.zeros(64, np.float32))
    with pytest.raises(DriverError, match="zero increment"):
        blas.saxpy(2, 1.0, p, 0, p, 1)
    with pytest.raises(DriverError, match="illegal address"):  # 64 floats cannot hold 10 x 10
        blas.sgemm("N", "N", 10, 10, 10, 1.0, p, 10, p, 10, 0.0, p, 10)


def test_one_handle_per_stream(dev):
    s = dev.stream()
    assert dev.blas() is dev.blas() and dev.blas(s) is dev.blas(s)
    assert dev.blas(s) is not dev.blas() and dev.blas(s).stream is s
