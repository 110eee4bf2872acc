"""The stand-in libcuda and libcublas (tests/standin) against independent truth: the stand-in
cuBLAS through ctypes against numpy, with the arguments cuBLAS refuses; NVIDIA's cuda-bindings
over the stand-in libcuda (device, memory, streams and events, a PTX and a CUBIN module of the
project's kernels launched and checked against numpy, refused images, a sticky fault, the
entry points cuGetProcAddress gives against cudaTypedefs.h, a context left pushed); pycuda
built from its sdist over it. The driver runs in subprocesses: the loader reads
LD_LIBRARY_PATH when a process starts. Each test skips, naming what is missing, where the
machine lacks a tool the stand-ins need."""
import ctypes
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest

from poseidon_caffe.backend.cuda import build
from standin import StandInUnavailable, headers, prepare

F32 = np.float32
RNG = np.random.default_rng(11)
INVALID_VALUE = 7                    # CUBLAS_STATUS_INVALID_VALUE
OP = {"N": 0, "T": 1, "C": 2}


@pytest.fixture(scope="module")
def standin():
    try:
        return prepare()
    except StandInUnavailable as exc:
        pytest.skip("the stand-in CUDA libraries cannot be built here: %s" % exc)


@pytest.fixture(scope="module")
def blas(standin):
    """The stand-in cuBLAS over host arrays: it checks operands against the stand-in libcuda's
    allocations only where that is loaded, which it never is in this process unless a test
    run over the stand-ins loads it here."""
    with open("/proc/self/maps") as maps:
        loaded = [line for line in maps if "libcuda.so" in line]
    if any(os.path.dirname(standin.lib_dir) in line for line in loaded):
        pytest.skip("the stand-in libcuda is loaded in this process: it would refuse the "
                    "host arrays these tests pass to the stand-in cuBLAS")
    lib = ctypes.CDLL(standin.libcublas)
    handle = ctypes.c_void_p()
    assert lib.cublasCreate_v2(ctypes.byref(handle)) == 0
    yield lib, handle
    lib.cublasDestroy_v2(handle)


def needs_bindings():
    try:
        found = importlib.util.find_spec("cuda.bindings") is not None
    except ImportError:                                  # no "cuda" package at all
        found = False
    if not found:
        pytest.skip("cuda-bindings is not installed (pip install 'cuda-bindings>=13,<14')")


def run(standin, code, env=None, pythonpath=None, expect=0):
    """Runs ``code`` in a fresh Python over the stand-ins; its stdout's last line as JSON."""
    environ = standin.environ()
    environ.update(env or {})
    if pythonpath:
        environ["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath,
                                                              environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == expect, done.stdout + done.stderr
    return json.loads(done.stdout.splitlines()[-1]) if expect == 0 else done


# -- the stand-in cuBLAS, through ctypes over host memory ------------------------------------
def _p(array):
    return ctypes.c_void_p(array.ctypes.data)


def _f(value):
    return ctypes.byref(ctypes.c_float(value))


def _column_major(buf, rows, cols, ld):
    """The rows x cols matrix stored column-major in ``buf`` (column j at j * ld)."""
    return np.stack([buf[j * ld:j * ld + rows] for j in range(cols)], axis=1)


def test_cublas_sgemm_and_sgemv_against_numpy(blas):
    lib, h = blas
    m, n, k = 3, 4, 5
    for ta, tb in [("N", "N"), ("T", "N"), ("N", "T"), ("C", "T")]:
        a_rows, a_cols = (m, k) if ta == "N" else (k, m)
        b_rows, b_cols = (k, n) if tb == "N" else (n, k)
        lda, ldb, ldc = a_rows + 2, b_rows + 1, m + 3
        a = RNG.standard_normal(lda * a_cols).astype(F32)
        b = RNG.standard_normal(ldb * b_cols).astype(F32)
        c = np.full(ldc * n, np.nan, F32)              # not read when beta is 0
        assert lib.cublasSgemm_v2(h, OP[ta], OP[tb], m, n, k, _f(1.5), _p(a), lda, _p(b), ldb,
                                  _f(0.0), _p(c), ldc) == 0
        A, B = _column_major(a, a_rows, a_cols, lda), _column_major(b, b_rows, b_cols, ldb)
        expected = 1.5 * (A if ta == "N" else A.T).astype(float) @ (B if tb == "N" else B.T)
        np.testing.assert_allclose(_column_major(c, m, n, ldc), expected, rtol=1e-5, atol=1e-5)
        assert np.isnan(c.reshape(n, ldc)[:, m:]).all()      # the padding is left alone
    # y = alpha A^T x + beta y, x walked backwards
    a = RNG.standard_normal(4 * 3).astype(F32)
    x, y = RNG.standard_normal(4).astype(F32), RNG.standard_normal(3).astype(F32)
    before = y.copy()
    assert lib.cublasSgemv_v2(h, OP["T"], 4, 3, _f(2.0), _p(a), 4, _p(x), -1, _f(0.5), _p(y),
                              1) == 0
    expected = 2.0 * a.reshape(3, 4).astype(float) @ x[::-1] + 0.5 * before
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_cublas_strided_batches_vectors_and_sgeam_against_numpy(blas):
    lib, h = blas
    batch, m, n, k = 3, 2, 3, 4
    a = RNG.standard_normal(batch * m * k).astype(F32)
    b = RNG.standard_normal(k * n).astype(F32)             # one B for every batch (stride 0)
    c = np.zeros(batch * m * n, F32)
    assert lib.cublasSgemmStridedBatched(h, 0, 0, m, n, k, _f(1.0), _p(a), m,
                                         ctypes.c_longlong(m * k), _p(b), k, ctypes.c_longlong(0),
                                         _f(0.0), _p(c), m, ctypes.c_longlong(m * n), batch) == 0
    for i in range(batch):
        A = a[i * m * k:(i + 1) * m * k].reshape(k, m).T
        np.testing.assert_allclose(c[i * m * n:(i + 1) * m * n].reshape(n, m).T,
                                   A.astype(float) @ b.reshape(n, k).T, rtol=1e-5, atol=1e-5)
    x, y = RNG.standard_normal(6).astype(F32), RNG.standard_normal(3).astype(F32)
    result = ctypes.c_float()
    assert lib.cublasSdot_v2(h, 3, _p(x), 2, _p(y), -1, ctypes.byref(result)) == 0
    assert result.value == pytest.approx(float(np.dot(x[::2].astype(float), y[::-1])), rel=1e-6)
    assert lib.cublasSasum_v2(h, 3, _p(x), -1, ctypes.byref(result)) == 0 and result.value == 0
    assert lib.cublasSasum_v2(h, 3, _p(x), 2, ctypes.byref(result)) == 0
    assert result.value == pytest.approx(float(np.abs(x[::2]).sum()), rel=1e-6)
    before = y.copy()
    assert lib.cublasSaxpy_v2(h, 3, _f(-2.0), _p(x), -2, _p(y), 1) == 0
    np.testing.assert_array_equal(y, F32(-2.0) * x[::2][::-1] + before)
    assert lib.cublasSscal_v2(h, 3, _f(3.0), _p(y), 0) == 0          # ignored, as BLAS does
    np.testing.assert_array_equal(y, F32(-2.0) * x[::2][::-1] + before)
    # C = alpha A^T + beta B, and B not read when beta is 0
    a, b = RNG.standard_normal(6).astype(F32), np.full(6, np.nan, F32)
    out = np.empty(6, F32)
    assert lib.cublasSgeam(h, 1, 0, 2, 3, _f(2.0), _p(a), 3, _f(0.0), _p(b), 2, _p(out), 2) == 0
    np.testing.assert_array_equal(out.reshape(3, 2).T, F32(2.0) * a.reshape(2, 3))


def test_cublas_refuses_what_cublas_refuses(blas):
    lib, h = blas
    p = np.zeros(64, F32)
    one, zero = _f(1.0), _f(0.0)
    refused = {
        "lda below the rows": lib.cublasSgemm_v2(h, 0, 0, 2, 2, 2, one, _p(p), 1, _p(p), 2,
                                                 zero, _p(p), 2),
        "ldc below m": lib.cublasSgemm_v2(h, 0, 0, 3, 2, 2, one, _p(p), 3, _p(p), 2, zero,
                                          _p(p), 2),
        "a negative size": lib.cublasSgemm_v2(h, 0, 0, -1, 2, 2, one, _p(p), 1, _p(p), 2,
                                               zero, _p(p), 1),
        "an unknown transpose": lib.cublasSgemm_v2(h, 5, 0, 2, 2, 2, one, _p(p), 2, _p(p), 2,
                                                   zero, _p(p), 2),
        "a negative batch": lib.cublasSgemmStridedBatched(
            h, 0, 0, 2, 2, 2, one, _p(p), 2, ctypes.c_longlong(4), _p(p), 2,
            ctypes.c_longlong(4), zero, _p(p), 2, ctypes.c_longlong(4), -1),
        "sgemv's zero increment": lib.cublasSgemv_v2(h, 0, 2, 2, one, _p(p), 2, _p(p), 0, zero,
                                                     _p(p), 1),
        "saxpy's zero increment": lib.cublasSaxpy_v2(h, 2, one, _p(p), 0, _p(p), 1),
        "sgeam transposed in place": lib.cublasSgeam(h, 1, 0, 2, 2, one, _p(p), 2, zero, _p(p),
                                                     2, _p(p), 2),
        "sgeam ldb below its rows": lib.cublasSgeam(h, 0, 1, 2, 3, one, _p(p), 2, one, _p(p), 2,
                                                    _p(p[8:]), 2),
    }
    assert refused == dict.fromkeys(refused, INVALID_VALUE)
    assert lib.cublasSgemm_v2(h, 0, 0, 0, 2, 2, one, None, 1, None, 2, zero, None, 1) == 0
    assert lib.cublasSgemm_v2(None, 0, 0, 2, 2, 2, one, _p(p), 2, _p(p), 2, zero, _p(p), 2) == 1
    version = ctypes.c_int()
    assert lib.cublasGetVersion_v2(h, ctypes.byref(version)) == 0
    assert version.value == 130100                          # cublas_api.h's CUBLAS_VERSION


# -- the header fetch ---------------------------------------------------------------------------
def test_a_zip_member_is_read_from_the_end_of_the_archive_and_checked(tmp_path):
    path = tmp_path / "w.whl"
    text = b"#define CUBLAS_VER_MAJOR 13\n" * 500
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a/other.txt", b"x" * 100)
        z.writestr("nvidia/cu13/include/cublas_api.h", text)
    with headers.open_archive(path.as_uri()) as archive:
        assert headers.read_member(archive, "nvidia/cu13/include/cublas_api.h") == text
        with pytest.raises(ValueError, match="no member"):
            headers.read_member(archive, "nvidia/cu13/include/cuda.h")
    data = bytearray(path.read_bytes())
    at = data.index(b"cublas_api.h") + len(b"cublas_api.h") + 3   # inside the deflated data
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    with headers.open_archive(path.as_uri()) as archive:
        with pytest.raises(Exception):                   # a CRC mismatch or a broken stream
            headers.read_member(archive, "nvidia/cu13/include/cublas_api.h")


# -- cuda-bindings over the stand-in libcuda ----------------------------------------------------
BINDINGS_PRELUDE = """
    import ctypes, json, os
    import numpy as np
    from cuda.bindings import driver as cu
    R = cu.CUresult
    def ok(result):
        assert result[0] == R.CUDA_SUCCESS, result
        return result[1] if len(result) == 2 else result[1:]
    def name(result):
        return cu.cuGetErrorName(result[0] if isinstance(result, tuple) else result)[1].decode()
    ok(cu.cuInit(0))
    dev = ok(cu.cuDeviceGet(0))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
"""


def test_cuda_bindings_device_memory_streams_and_events(standin):
    needs_bindings()
    got = run(standin, BINDINGS_PRELUDE + """
    out = {"pop_empty": name(cu.cuCtxPopCurrent()), "alloc_without_context": name(cu.cuMemAlloc(4))}
    ok(cu.cuCtxPushCurrent(ctx))
    out["name"] = ok(cu.cuDeviceGetName(100, dev)).split(b"\\0")[0].decode()
    A = cu.CUdevice_attribute
    out["cc"] = [ok(cu.cuDeviceGetAttribute(a, dev)) for a in
                 (A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                  A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)]
    out["driver"] = ok(cu.cuDriverGetVersion())
    out["count"] = ok(cu.cuDeviceGetCount())
    free0, total = ok(cu.cuMemGetInfo())
    x = np.arange(1000, dtype=np.float32)
    p, q = ok(cu.cuMemAlloc(4000)), ok(cu.cuMemAlloc(4000))
    out["fresh"] = ok(cu.cuMemGetInfo())[0] == free0 - 8000
    s = ok(cu.cuStreamCreate(1))
    ok(cu.cuMemcpyHtoDAsync(p, x, 4000, s))
    ok(cu.cuMemcpyDtoDAsync(q, p, 4000, s))
    ok(cu.cuMemsetD32Async(int(q) + 40, 0x3F800000, 10, s))      # 1.0f over floats 10..19
    ok(cu.cuMemsetD8(int(p), 0, 4))
    y, z = np.empty_like(x), np.empty_like(x)
    ok(cu.cuMemcpyDtoHAsync(y, q, 4000, s)); ok(cu.cuMemcpyDtoH(z, p, 4000))
    out["round_trip"] = bool((y[:10] == x[:10]).all() and (y[10:20] == 1).all() and
                             (y[20:] == x[20:]).all() and z[0] == 0 and (z[1:] == x[1:]).all())
    out["copy_past_the_end"] = name(cu.cuMemcpyHtoD(int(p) + 3996, x, 8))
    e0, e1 = ok(cu.cuEventCreate(0)), ok(cu.cuEventCreate(0))
    out["unrecorded_query"] = name(cu.cuEventQuery(e0))
    out["unrecorded_elapsed"] = name(cu.cuEventElapsedTime(e0, e1))
    ok(cu.cuEventRecord(e0, s)); ok(cu.cuEventRecord(e1, s)); ok(cu.cuStreamWaitEvent(s, e1, 0))
    out["elapsed"] = ok(cu.cuEventElapsedTime(e0, e1)) >= 0
    ok(cu.cuStreamSynchronize(s)); ok(cu.cuStreamDestroy(s))
    ok(cu.cuMemFree(p)); out["double_free"] = name(cu.cuMemFree(p))
    out["stub"] = name(cu.cuCtxGetLimit(cu.CUlimit.CU_LIMIT_STACK_SIZE))
    out["current"] = int(ok(cu.cuCtxGetCurrent())) == int(ctx)
    ok(cu.cuCtxPopCurrent())
    out["after_pop"] = int(ok(cu.cuCtxGetCurrent()))
    print(json.dumps(out))
    """)
    assert "stand-in" in got.pop("name")
    assert got == {
        "pop_empty": "CUDA_ERROR_INVALID_CONTEXT",
        "alloc_without_context": "CUDA_ERROR_INVALID_CONTEXT",
        "cc": [9, 0], "driver": 13000, "count": 1, "fresh": True, "round_trip": True,
        "copy_past_the_end": "CUDA_ERROR_INVALID_VALUE",
        "unrecorded_query": "CUDA_SUCCESS",                 # as CUDA answers
        "unrecorded_elapsed": "CUDA_ERROR_INVALID_HANDLE",
        "elapsed": True, "double_free": "CUDA_ERROR_INVALID_VALUE",
        "stub": "CUDA_ERROR_NOT_SUPPORTED", "current": True, "after_pop": 0}


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """PTX and CUBIN images of math.cu (NVRTC, here in the test process) and an sm_80 CUBIN."""
    from poseidon_caffe.backend.cuda.nvrtc import NVRTCError
    from standin.cubin import compile_cubin
    folder = tmp_path_factory.mktemp("images")
    source = build.sources()["math"]
    try:
        ptx = build.ptx(source, 90)
        cubins = {arch: compile_cubin(source, arch) for arch in (90, 80)}
    except (NVRTCError, build.BuildError) as exc:
        pytest.skip("NVRTC cannot build the kernels here: %s" % str(exc).splitlines()[0])
    paths = {"ptx": folder / "math.ptx", "cubin": folder / "math.cubin",
             "cubin80": folder / "math80.cubin"}
    paths["ptx"].write_bytes(ptx + b"\0")
    paths["cubin"].write_bytes(cubins[90])
    paths["cubin80"].write_bytes(cubins[80])
    return {kind: str(path) for kind, path in paths.items()}


def test_cuda_bindings_runs_ptx_and_cubin_kernels(standin, images):
    needs_bindings()
    got = run(standin, BINDINGS_PRELUDE + """
    ok(cu.cuCtxSetCurrent(ctx))
    images = json.loads(os.environ["IMAGES"])
    rng = np.random.default_rng(3)
    n = 1000
    x, y0 = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    scale, bias = (rng.standard_normal(5).astype(np.float32) for _ in range(2))
    px, py, ps, pb = (ok(cu.cuMemAlloc(4 * a.size)) for a in (x, y0, scale, bias))
    for p, a in ((px, x), (ps, scale), (pb, bias)):
        ok(cu.cuMemcpyHtoD(p, a, a.nbytes))
    P, I, F = None, ctypes.c_int, ctypes.c_float
    out = {}
    for kind in ("ptx", "cubin"):
        with open(images[kind], "rb") as f:
            module = ok(cu.cuModuleLoadData(f.read()))
        axpby = ok(cu.cuModuleGetFunction(module, b"vec_axpby"))
        ok(cu.cuMemcpyHtoD(py, y0, 4 * n))
        ok(cu.cuLaunchKernel(axpby, 4, 1, 1, 256, 1, 1, 0, 0,
                             ((n, 1.5, px, -0.5, py), (I, F, P, F, P)), 0))
        y = np.empty(n, np.float32); ok(cu.cuMemcpyDtoH(y, py, 4 * n))
        expected = np.float32(1.5) * x + np.float32(-0.5) * y0
        out[kind + "_axpby"] = bool(np.array_equal(y, expected))
        channel = ok(cu.cuModuleGetFunction(module, b"channel_scale"))
        ok(cu.cuLaunchKernel(channel, 2, 1, 1, 256, 1, 1, 0, 0,
                             ((n, px, ps, pb, 5, 20, py), (I, P, P, P, I, I, P)), 0))
        ok(cu.cuMemcpyDtoH(y, py, 4 * n))
        d = np.arange(n) // 20 % 5
        out[kind + "_channel_scale"] = bool(np.array_equal(y, x * scale[d] + bias[d]))
        out[kind + "_wrong_name"] = name(cu.cuModuleGetFunction(module, b"vec_axpbyy"))
        ok(cu.cuModuleUnload(module))
    with open(images["cubin80"], "rb") as f:
        out["cubin_sm80"] = name(cu.cuModuleLoadData(f.read()))
    with open(images["ptx"], "rb") as f:
        ptx = f.read()
    version = ptx[ptx.index(b".version"):].split(b"\\n")[0]
    out["ptx_9_1"] = name(cu.cuModuleLoadData(ptx.replace(version, b".version 9.1")))
    out["not_an_image"] = name(cu.cuModuleLoadData(b"hello\\0"))
    ok(cu.cuCtxSetCurrent(None))
    print(json.dumps(out))
    """, env={"IMAGES": json.dumps(images)})
    assert got == {
        "ptx_axpby": True, "ptx_channel_scale": True, "ptx_wrong_name": "CUDA_ERROR_NOT_FOUND",
        "cubin_axpby": True, "cubin_channel_scale": True,
        "cubin_wrong_name": "CUDA_ERROR_NOT_FOUND",
        "cubin_sm80": "CUDA_ERROR_NO_BINARY_FOR_GPU",
        "ptx_9_1": "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",     # a 13.0 driver reads PTX 9.0
        "not_an_image": "CUDA_ERROR_INVALID_IMAGE"}


def test_a_fault_loses_the_device_as_on_a_gpu(standin, images):
    needs_bindings()
    fault = BINDINGS_PRELUDE + """
    ok(cu.cuCtxPushCurrent(ctx))
    with open(json.loads(os.environ["IMAGES"])["ptx"], "rb") as f:
        axpby = ok(cu.cuModuleGetFunction(ok(cu.cuModuleLoadData(f.read())), b"vec_axpby"))
    p = ok(cu.cuMemAlloc(4096))
    types = (ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p)
    out = {"empty": name(cu.cuLaunchKernel(axpby, 1, 1, 1, 32, 1, 1, 0, 0,   # touches nothing
                                           ((0, 1.0, 16, 0.0, 16), types), 0))}
    if os.environ.get("BLAS"):                                # an operand past the allocation
        blas = ctypes.CDLL(os.environ["POSEIDON_CAFFE_CUBLAS"])
        h = ctypes.c_void_p(); blas.cublasCreate_v2(ctypes.byref(h))
        one = ctypes.byref(ctypes.c_float(1))
        out["launch"] = blas.cublasSgemm_v2(h, 0, 0, 40, 40, 40, one, ctypes.c_void_p(int(p)),
                                            40, ctypes.c_void_p(int(p)), 40, one,
                                            ctypes.c_void_p(int(p)), 40)
    else:                                                     # a kernel through a wild pointer
        out["launch"] = name(cu.cuLaunchKernel(axpby, 1, 1, 1, 32, 1, 1, 0, 0,
                                               ((8, 1.0, int(p), 0.0, 16), types), 0))
    out["synchronize"] = name(cu.cuCtxSynchronize())
    out["copy"] = name(cu.cuMemcpyDtoH(np.empty(4, np.float32), p, 16))
    cu.cuCtxPopCurrent()
    print(json.dumps(out))
    """
    lost = {"synchronize": "CUDA_ERROR_ILLEGAL_ADDRESS", "copy": "CUDA_ERROR_ILLEGAL_ADDRESS"}
    images_env = {"IMAGES": json.dumps(images)}
    assert run(standin, fault, env=images_env) == dict(lost, empty="CUDA_SUCCESS",
                                                       launch="CUDA_SUCCESS")
    assert run(standin, fault, env=dict(images_env, CUDA_LAUNCH_BLOCKING="1")) == dict(
        lost, empty="CUDA_SUCCESS", launch="CUDA_ERROR_ILLEGAL_ADDRESS")
    blas = dict(images_env, BLAS="1")
    assert run(standin, fault, env=blas) == dict(lost, empty="CUDA_SUCCESS", launch=0)
    assert run(standin, fault, env=dict(blas, CUDA_LAUNCH_BLOCKING="1")) == dict(
        lost, empty="CUDA_SUCCESS", launch=13)                # CUBLAS_STATUS_EXECUTION_FAILED


def test_entry_points_follow_the_headers_abi_versions(standin):
    """cuGetProcAddress gives, for a base name and a CUDA version, the newest ABI at or below
    that version, as cudaTypedefs.h lists them (PFN_cuCtxGetDevice_v13000 takes a context)."""
    got = run(standin, """
    import ctypes, json
    lib = ctypes.CDLL("libcuda.so.1")
    get = lib.cuGetProcAddress_v2
    get.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                    ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
    def address(symbol):
        return ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value
    out = {}
    for base, version, symbol in [("cuMemAlloc", 13000, "cuMemAlloc_v2"),
                                  ("cuMemAlloc", 2000, "cuMemAlloc"),
                                  ("cuCtxGetDevice", 12080, "cuCtxGetDevice"),
                                  ("cuCtxGetDevice", 13000, "cuCtxGetDevice_v2"),
                                  ("cuCtxCreate", 13000, "cuCtxCreate_v4"),
                                  ("cuGetProcAddress", 12000, "cuGetProcAddress_v2"),
                                  ("cuEventElapsedTime", 13000, "cuEventElapsedTime_v2"),
                                  ("cuLaunchKernel", 13000, "cuLaunchKernel"),
                                  ("cuProfilerStart", 13000, "cuProfilerStart")]:
        fn, status = ctypes.c_void_p(), ctypes.c_int(-1)
        r = get(base.encode(), ctypes.byref(fn), version, 0, ctypes.byref(status))
        out["%s@%d" % (base, version)] = [r, status.value, fn.value == address(symbol)]
    for base, version in [("cuCtxGetDevice", 1000), ("cuNoSuchFunction", 13000),
                          ("cuMemAlloc_v2", 13000)]:
        fn, status = ctypes.c_void_p(), ctypes.c_int(-1)
        out["%s@%d" % (base, version)] = [get(base.encode(), ctypes.byref(fn), version, 0,
                                              ctypes.byref(status)), status.value, fn.value]
    # an old ABI the stand-in does not implement is there, and fails when called
    lib.cuInit(0)
    out["stub_called"] = ctypes.CFUNCTYPE(ctypes.c_int)(address("cuMemAlloc"))()
    print(json.dumps(out))
    """)
    success = [0, 0, True]
    assert got == {
        "cuMemAlloc@13000": success, "cuMemAlloc@2000": success,
        "cuCtxGetDevice@12080": success, "cuCtxGetDevice@13000": success,
        "cuCtxCreate@13000": success, "cuGetProcAddress@12000": success,
        "cuEventElapsedTime@13000": success, "cuLaunchKernel@13000": success,
        "cuProfilerStart@13000": success,
        # CUDA_ERROR_NOT_FOUND, with CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT / _SYMBOL_NOT_FOUND
        "cuCtxGetDevice@1000": [500, 2, None], "cuNoSuchFunction@13000": [500, 1, None],
        "cuMemAlloc_v2@13000": [500, 1, None],
        "stub_called": 801}                                  # CUDA_ERROR_NOT_SUPPORTED


LEFT_PUSHED = BINDINGS_PRELUDE + """
    import threading
    push = lambda: ok(cu.cuCtxPushCurrent(ctx))
    where = os.environ["WHERE"]
    if where == "thread":
        t = threading.Thread(target=push); t.start(); t.join()
    elif where == "set":                     # made current, not pushed: nothing to pop
        t = threading.Thread(target=lambda: ok(cu.cuCtxSetCurrent(ctx))); t.start(); t.join()
    else:
        push()
        if where == "popped":
            ok(cu.cuCtxPopCurrent())
    print(json.dumps("done"))
"""


@pytest.mark.parametrize("where,aborts", [("process", True), ("thread", True),
                                          ("popped", False), ("set", False)])
def test_a_context_left_pushed_aborts_under_the_exit_check(standin, where, aborts):
    needs_bindings()
    env = {"WHERE": where, "STANDIN_CUDA_CHECK_EXIT": "1"}
    if not aborts:
        assert run(standin, LEFT_PUSHED, env=env) == "done"
        return
    done = run(standin, LEFT_PUSHED, env=env, expect=-6)                 # SIGABRT, as pycuda
    assert "%s ends with 1 context pushed and never popped" % (
        "the process" if where == "process" else "a thread") in done.stderr
    assert run(standin, LEFT_PUSHED, env={"WHERE": where}) == "done"     # CUDA itself lets it be


# -- pycuda, built from its sdist against the stand-in -------------------------------------------
def test_pycuda_over_the_standin(standin, images):
    from standin.pycuda_build import pycuda_site
    try:
        site = pycuda_site(standin)
    except StandInUnavailable as exc:
        pytest.skip("pycuda cannot be built here: %s" % exc)
    got = run(standin, """
    import json, os
    import numpy as np
    import pycuda, pycuda.driver as cuda
    cuda.init()
    device = cuda.Device(0)
    context = device.retain_primary_context()
    context.push()
    out = {"version": list(pycuda.VERSION), "name": device.name(),
           "cc": list(device.compute_capability()), "driver": cuda.get_driver_version()}
    images = json.loads(os.environ["IMAGES"])
    n = 1000
    x = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    y0 = np.random.default_rng(6).standard_normal(n).astype(np.float32)
    px, py = cuda.mem_alloc(4 * n), cuda.mem_alloc(4 * n)
    cuda.memcpy_htod(px, x)
    stream = cuda.Stream(flags=1)
    for kind in ("ptx", "cubin"):
        with open(images[kind], "rb") as f:
            module = cuda.module_from_buffer(f.read())
        axpby = module.get_function("vec_axpby")
        axpby.prepare("ifPfP")                  # a packed parameter buffer, floats between
        cuda.memcpy_htod(py, y0)
        axpby.prepared_call((4, 1), (256, 1, 1), np.int32(n), np.float32(1.5), np.uintp(int(px)),
                            np.float32(-0.5), np.uintp(int(py)))
        axpby.prepared_async_call((4, 1), (256, 1, 1), stream, np.int32(n), np.float32(2.0),
                                  np.uintp(int(py)), np.float32(0.0), np.uintp(int(py)))
        stream.synchronize()
        y = np.empty(n, np.float32)
        cuda.memcpy_dtoh(y, py)
        expected = np.float32(2.0) * (np.float32(1.5) * x + np.float32(-0.5) * y0)
        out[kind] = bool(np.array_equal(y, expected))
    context.pop()
    print(json.dumps(out))
    """, env={"IMAGES": json.dumps(images), "STANDIN_CUDA_CHECK_EXIT": "1"}, pythonpath=site)
    assert "stand-in" in got.pop("name")
    assert got == {"version": [2026, 1], "cc": [9, 0], "driver": 13000, "ptx": True,
                   "cubin": True}
