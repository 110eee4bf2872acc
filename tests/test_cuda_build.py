"""The kernel sources: every one compiles to PTX with NVRTC for sm_70 and sm_90 without a
warning, and with the host C++ compiler under -Wall -Werror; their parameter lists read from
the declarations; the disk cache; the rules that keep the two builds equal."""
import os
import re

import pytest

from emulated_device import needs_compiler
from poseidon_caffe.backend.cuda import build, kernels, nvrtc

SOURCES = build.sources()


def _nvrtc_or_skip():
    try:
        return nvrtc.nvrtc()
    except nvrtc.NVRTCError as exc:
        pytest.skip("NVRTC is not installed (the dev extra's nvidia-cuda-nvrtc-cu12): %s" % exc)


def test_the_kernel_sources_are_found():
    assert {"im2col", "pooling", "lrn", "softmax", "neuron", "math", "eltwise", "copy",
            "batchnorm", "embed", "accuracy", "updates", "mvn"} <= set(SOURCES)
    assert "common.cuh" in build.headers()


@pytest.mark.parametrize("arch", [70, 90])
@pytest.mark.parametrize("module", sorted(SOURCES))
def test_every_source_compiles_to_ptx_without_warnings(module, arch):
    compiler = _nvrtc_or_skip()
    if arch not in compiler.supported_archs():
        pytest.skip("NVRTC %d.%d does not target sm_%d (the cu12 wheel does)"
                    % (compiler.version() + (arch,)))
    ptx, log = build.compile_ptx(SOURCES[module], arch, compiler)
    assert build.source_warnings(log) == ""
    text = ptx.decode()
    assert ".target sm_%d" % arch in text
    # every declared kernel is an entry point of the module
    for name in kernels.source_signatures()[module]:
        assert re.search(r"\.entry\s+%s\s*\(" % name, text), name


def test_nvrtc_reports_a_source_warning_and_an_error():
    compiler = _nvrtc_or_skip()
    _, log = compiler.compile('extern "C" __global__ void k(int n) { int unused; }', "w.cu", 90)
    assert "never referenced" in build.source_warnings(log)
    with pytest.raises(nvrtc.NVRTCError, match="bad.cu"):
        compiler.compile('extern "C" __global__ void k(int n) { undeclared = 1; }', "bad.cu", 90)


def test_the_target_notice_is_not_a_source_warning():
    log = "nvrtc: warning: Architectures prior to '<compute/sm>_75' are deprecated and may be " \
          "removed in a future release"
    assert build.source_warnings(log) == ""
    assert build.source_warnings(log + "\nk.cu(3): warning #177-D: x") == "k.cu(3): warning #177-D: x"


@needs_compiler
@pytest.mark.parametrize("module", sorted(SOURCES))
def test_every_source_builds_for_the_host_with_all_warnings_as_errors(module, tmp_path,
                                                                      monkeypatch):
    assert "-Wall" in build.HOST_FLAGS and "-Werror" in build.HOST_FLAGS
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    path = build.host_library(SOURCES[module])
    assert os.path.dirname(path) == os.path.join(str(tmp_path), "kernels")
    import ctypes
    lib = ctypes.CDLL(path)
    for name in kernels.source_signatures()[module]:
        assert hasattr(lib, name), name


@needs_compiler
def test_a_host_build_error_names_the_source(tmp_path, monkeypatch):
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path / "cache"))
    bad = tmp_path / "bad.cu"
    bad.write_text('#include "common.cuh"\nKERNEL k(const int n, float* y) '
                   '{ CUDA_KERNEL_LOOP(i, n) { int unused; y[i] = 0; } }\n')
    with pytest.raises(build.BuildError, match="bad.cu") as info:
        build.host_library(str(bad))
    assert "unused" in str(info.value)           # -Wall -Werror made the warning an error


@needs_compiler
def test_the_host_build_is_cached_by_content(tmp_path, monkeypatch):
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path / "cache"))
    source = tmp_path / "k.cu"
    source.write_text('#include "common.cuh"\nKERNEL k(const int n, float* y) '
                      '{ CUDA_KERNEL_LOOP(i, n) { y[i] = 1; } }\n')
    first = build.host_library(str(source))
    stamp = os.stat(first).st_mtime_ns
    assert build.host_library(str(source)) == first and os.stat(first).st_mtime_ns == stamp
    source.write_text(source.read_text().replace("y[i] = 1", "y[i] = 2"))
    second = build.host_library(str(source))
    assert second != first and os.path.exists(first)
    leftovers = [n for n in os.listdir(os.path.dirname(first)) if ".tmp-" in n]
    assert leftovers == []


def test_the_ptx_cache_is_keyed_by_arch_and_reused(tmp_path, monkeypatch):
    compiler = _nvrtc_or_skip()
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    source = SOURCES["math"]
    code = build.ptx(source, 90)
    files = os.listdir(os.path.join(str(tmp_path), "kernels"))
    assert len(files) == 1 and files[0].startswith("math-sm90-")
    calls = []
    monkeypatch.setattr(build, "compile_ptx", lambda *a: calls.append(a))
    assert build.ptx(source, 90) == code and calls == []        # read back, not compiled
    monkeypatch.undo()
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    if 70 in compiler.supported_archs():
        assert b".target sm_70" in build.ptx(source, 70)
        assert len(os.listdir(os.path.join(str(tmp_path), "kernels"))) == 2


def test_the_cache_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path / "c"))
    assert build.cache_dir() == os.path.join(str(tmp_path / "c"), "kernels")
    monkeypatch.delenv(build.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert build.cache_dir() == os.path.join(str(tmp_path / "x"), "poseidon-caffe", "kernels")


def test_best_arch_takes_the_newest_the_device_runs():
    supported = [70, 75, 80, 86, 89, 90, 100, 120]
    assert build.best_arch((9, 0), supported) == 90
    assert build.best_arch((8, 9), supported) == 89
    assert build.best_arch((12, 1), supported) == 120
    with pytest.raises(build.BuildError, match="6.1"):
        build.best_arch((6, 1), supported)


# -- the parameter lists ----------------------------------------------------------------------
def test_signatures_are_read_from_the_declarations():
    text = """
    // KERNEL commented_out(const int n)
    KERNEL a(const int n, const float* x, float* y, const float alpha, const int* mask) {}
    KERNEL b(const int n,
             float* y) {}
    """
    assert kernels.signatures(text) == {"a": "iPPfP", "b": "iP"}
    with pytest.raises(kernels.SignatureError, match="index count"):
        kernels.signatures("KERNEL c(float* y, const int n) {}")
    with pytest.raises(kernels.SignatureError, match="double"):
        kernels.signatures("KERNEL d(const int n, double x) {}")


def test_every_kernel_has_a_signature_and_a_unique_name():
    table = kernels.source_signatures()
    names = [name for module in table.values() for name in module]
    assert len(names) == len(set(names)) > 70
    assert table["pooling"]["max_pool_forward"] == "iPiiiiiiiiiiPPP"


# -- what keeps the host build faithful ------------------------------------------------------
FORBIDDEN = ("__shared__", "__syncthreads", "atomic", "__shfl", "threadIdx", "blockIdx",
             "blockDim", "gridDim", "__ballot", "warpSize")
# kernels allowed to break the host-build rules (each needs a faithful host meaning in
# common.cuh and a line in README.md); none today
EXCEPTIONS = {}


@pytest.mark.parametrize("module", sorted(SOURCES))
def test_kernels_stay_inside_the_grid_stride_loop(module):
    with open(SOURCES[module], encoding="utf-8") as f:
        text = re.sub(r"//[^\n]*", "", f.read())
    for token in FORBIDDEN:
        assert token not in text or token in EXCEPTIONS.get(module, ()), \
            "%s.cu uses %s, which the host build cannot reproduce" % (module, token)
    # every kernel body is one CUDA_KERNEL_LOOP
    bodies = re.split(r"\bKERNEL\s+\w+\s*\(", text)[1:]
    for body in bodies:
        assert body.count("CUDA_KERNEL_LOOP(") == 1, body[:80]
