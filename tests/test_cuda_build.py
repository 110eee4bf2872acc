"""The kernel sources: every one compiles to PTX with NVRTC for sm_70 and sm_90 without a
warning, and with the host C++ compiler under -Wall -Werror; their parameter lists read from
the declarations; the disk cache; the rules that keep the two builds equal."""
import os
import re

import pytest

from emulated_device import needs_compiler
from poseidon_caffe.backend.cuda import build, launch, nvrtc

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
    for name in launch.source_signatures()[module]:
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
    for name in launch.source_signatures()[module]:
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
    assert len(files) == 1 and files[0].startswith("math-compute90-") and files[0].endswith(".ptx")
    calls = []
    monkeypatch.setattr(build, "compile_image", lambda *a: calls.append(a))
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
    assert launch.signatures(text) == {"a": "iPPfP", "b": "iP"}
    with pytest.raises(launch.SignatureError, match="index count"):
        launch.signatures("KERNEL c(float* y, const int n) {}")
    with pytest.raises(launch.SignatureError, match="double"):
        launch.signatures("KERNEL d(const int n, double x) {}")


def test_every_kernel_has_a_signature_and_a_unique_name():
    table = launch.source_signatures()
    names = [name for module in table.values() for name in module]
    assert len(names) == len(set(names)) > 70
    assert table["pooling"]["max_pool_forward"] == "iPiiiiiiiiiiPPP"


def test_every_source_has_its_kernels_as_named_objects():
    """kernels/<module>.py lists exactly the kernels of kernels/<module>.cu, with their
    signatures: stale after a kernel changes until scripts/kernel_stubs.py rewrites it."""
    import importlib
    import os
    from poseidon_caffe.backend.cuda import kernels
    from poseidon_caffe.backend.cuda.launch import Kernel
    for module, source in build.sources().items():
        path = os.path.splitext(source)[0] + ".py"
        with open(path, encoding="utf-8") as f:
            assert f.read() == launch.stub_text(module), \
                "%s differs from %s: run scripts/kernel_stubs.py" % (path, source)
        stubs = importlib.import_module(kernels.__name__ + "." + module)
        listed = {k.name: k.signature for k in vars(stubs).values() if isinstance(k, Kernel)}
        assert listed == launch.source_signatures()[module]
        assert getattr(kernels, module) is stubs          # the package imports every one


def test_a_changed_declaration_changes_the_stub(tmp_path, monkeypatch):
    kernel_dir = tmp_path / "kernels"
    kernel_dir.mkdir()
    (kernel_dir / "demo.cu").write_text("KERNEL scale_by(const int n, float* y, const float a)"
                                        " {}\n")
    monkeypatch.setattr(build, "KERNEL_DIR", str(kernel_dir))
    text = launch.stub_text("demo")
    assert 'scale_by = Kernel("demo", "scale_by", "iPf")' in text
    assert "# (n, y, a)" in text


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


@pytest.mark.parametrize("module", ["math", "pooling"])
def test_a_source_compiles_to_a_cubin_whose_symbols_are_its_kernels(module):
    compiler = _nvrtc_or_skip()
    if 90 not in compiler.supported_archs() or not compiler.writes_cubin:
        pytest.skip("NVRTC %d.%d writes no sm_90 CUBIN" % compiler.version())
    image, log = build.compile_image(SOURCES[module], 90, compiler, cubin=True)
    assert build.source_warnings(log) == ""
    assert image[:4] == b"\x7fELF" and image[4] == 2          # a 64-bit ELF: machine code
    names = _elf_function_names(image)
    assert set(launch.source_signatures()[module]) <= names


def _elf_function_names(image):
    """The names of the function symbols of a 64-bit little-endian ELF image, read by the
    format's own rules (section headers, .symtab, its string table)."""
    import struct
    shoff, = struct.unpack_from("<Q", image, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", image, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", image, shoff + i * shentsize)
                for i in range(shnum)]
    names = set()
    for sh_type, offset, size, link, entsize in ((s[1], s[4], s[5], s[6], s[9])
                                                 for s in sections):
        if sh_type != 2:                                   # SHT_SYMTAB
            continue
        strtab = sections[link][4]
        for at in range(offset, offset + size, entsize):
            name_at, info = struct.unpack_from("<IB", image, at)
            if info & 0xF == 2:                            # STT_FUNC
                end = image.index(b"\0", strtab + name_at)
                names.add(image[strtab + name_at:end].decode())
    return names


def test_the_cubin_cache_is_apart_from_the_ptx_cache(tmp_path, monkeypatch):
    compiler = _nvrtc_or_skip()
    if 90 not in compiler.supported_archs() or not compiler.writes_cubin:
        pytest.skip("NVRTC %d.%d writes no sm_90 CUBIN" % compiler.version())
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    cubin = build.image(SOURCES["math"], 90, cubin=True)
    ptx = build.image(SOURCES["math"], 90)
    assert cubin[:4] == b"\x7fELF" and b".target sm_90" in ptx
    files = sorted(os.listdir(os.path.join(str(tmp_path), "kernels")))
    assert [(f.split("-")[1], f.rsplit(".", 1)[1]) for f in files] == [
        ("compute90", "ptx"), ("sm90", "cubin")]
    assert build.image(SOURCES["math"], 90, cubin=True) == cubin


class _FakeNVRTC:
    """What images.plan reads of an NVRTC: its version, targets and CUBIN support."""

    def __init__(self, version, archs, cubin=True):
        self._version, self._archs, self.writes_cubin = version, archs, cubin
        self.path = "libnvrtc.so.%d" % version[0]

    def version(self):
        return self._version

    def supported_archs(self):
        return self._archs


NVRTC_13_5 = _FakeNVRTC((13, 5), [75, 80, 86, 89, 90, 100, 120])
NVRTC_12_9 = _FakeNVRTC((12, 9), [50, 60, 70, 75, 80, 86, 89, 90, 100, 120])


def test_the_image_is_a_cubin_for_the_device_when_nvrtc_knows_it():
    from poseidon_caffe.backend.cuda import images
    # a newer minor's CUBIN loads on an older driver of the same major
    assert images.plan((9, 0), 13000, [NVRTC_13_5, NVRTC_12_9]) == (NVRTC_13_5, 90, True)
    # NVRTC 13 no longer targets sm_70: CUDA 12's NVRTC builds for a V100
    assert images.plan((7, 0), 13000, [NVRTC_13_5, NVRTC_12_9]) == (NVRTC_12_9, 70, True)


def test_ptx_is_built_only_by_an_nvrtc_the_driver_can_read():
    from poseidon_caffe.backend.cuda import images
    # a device newer than every NVRTC target: PTX for the newest target below it
    assert images.plan((12, 1), 12090, [NVRTC_12_9]) == (NVRTC_12_9, 120, False)
    # 13.5's PTX is refused by a 13.0 driver, and CUDA 12's NVRTC can serve instead
    assert images.plan((12, 1), 13000, [NVRTC_13_5, NVRTC_12_9]) == (NVRTC_12_9, 120, False)
    # a CUDA 12 driver never gets CUDA 13's images
    assert images.plan((9, 0), 12080, [NVRTC_13_5, NVRTC_12_9]) == (NVRTC_12_9, 90, True)
    from poseidon_caffe.backend.cuda.driver import DriverError
    with pytest.raises(DriverError, match=r"NVRTC 13\.5 writes PTX the CUDA 13\.0 driver"):
        images.plan((12, 1), 13000, [NVRTC_13_5])
    with pytest.raises(DriverError, match=r"NVRTC 13\.5 targets nothing at or below sm_61"):
        images.plan((6, 1), 13050, [NVRTC_13_5])


def test_nvidia_wheels_are_found_in_both_layouts(tmp_path, monkeypatch):
    from poseidon_caffe.backend.cuda import libraries
    site = tmp_path / "site"
    for rel in ("nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cu13/lib/libnvrtc.alt.so.13",
                "nvidia/cu13/lib/libnvrtc-builtins.so.13.0",
                "nvidia/cuda_nvrtc/lib/libnvrtc.so.12", "nvidia/cublas/lib/libcublas.so.12",
                "nvidia/cu13/lib/libcublas.so.13", "nvidia/cu13/lib/libcublas.so.13.1.0.3"):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(b"")
    for package in ("nvidia", "nvidia/cu13", "nvidia/cuda_nvrtc", "nvidia/cublas"):
        (site / package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    import importlib
    import sys
    for name in [m for m in sys.modules if m == "nvidia" or m.startswith("nvidia.")]:
        monkeypatch.delitem(sys.modules, name)
    importlib.invalidate_caches()
    monkeypatch.delenv("POSEIDON_CAFFE_NVRTC", raising=False)
    monkeypatch.delenv("POSEIDON_CAFFE_CUBLAS", raising=False)
    found = libraries.candidates("nvrtc", "POSEIDON_CAFFE_NVRTC")
    ours = [p for p in found if p.startswith(str(site))]
    assert [os.path.relpath(p, str(site)) for p in ours] == [
        "nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12"]
    assert libraries.by_major(ours, "nvrtc", max_major=12) == ours[1:]
    blas = [os.path.relpath(p, str(site)) for p in libraries.candidates(
        "cublas", "POSEIDON_CAFFE_CUBLAS") if p.startswith(str(site))]
    assert blas == ["nvidia/cu13/lib/libcublas.so.13", "nvidia/cublas/lib/libcublas.so.12"]
    monkeypatch.setenv("POSEIDON_CAFFE_NVRTC", "/x/libnvrtc.so.13")
    assert libraries.candidates("nvrtc", "POSEIDON_CAFFE_NVRTC") == ["/x/libnvrtc.so.13"]
