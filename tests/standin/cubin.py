"""A kernel source compiled to a CUBIN (machine code for one GPU architecture, an ELF image)
with the project's NVRTC, through nvrtcGetCUBIN: what a real driver loads without compiling,
and what the stand-in libcuda reads kernels and their parameter sizes from."""
import ctypes
import os

from poseidon_caffe.backend.cuda import build, nvrtc


def compile_cubin(source_path, arch=90, compiler=None):
    """The CUBIN of one kernel source for sm_<arch>; nvrtc.NVRTCError when NVRTC is missing,
    cannot write CUBIN, or the source does not compile."""
    compiler = compiler or nvrtc.nvrtc()
    lib = compiler.lib
    if not hasattr(lib, "nvrtcGetCUBIN"):
        raise nvrtc.NVRTCError("this NVRTC (%s) cannot write CUBIN" % compiler.path)
    p, c, size_p = ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)
    create = _function(lib, "nvrtcCreateProgram", [ctypes.POINTER(p), c, c, ctypes.c_int,
                                                    ctypes.POINTER(c), ctypes.POINTER(c)])
    compile_ = _function(lib, "nvrtcCompileProgram", [p, ctypes.c_int, ctypes.POINTER(c)])
    cubin_size = _function(lib, "nvrtcGetCUBINSize", [p, size_p])
    get_cubin = _function(lib, "nvrtcGetCUBIN", [p, c])
    log_size = _function(lib, "nvrtcGetProgramLogSize", [p, size_p])
    get_log = _function(lib, "nvrtcGetProgramLog", [p, c])
    destroy = _function(lib, "nvrtcDestroyProgram", [ctypes.POINTER(p)])

    headers = build.headers()
    names = (c * max(1, len(headers)))(*[k.encode() for k in headers])
    texts = (c * max(1, len(headers)))(*[v.encode() for v in headers.values()])
    with open(source_path, encoding="utf-8") as f:
        source = f.read()
    program = p()
    _check(create(ctypes.byref(program), source.encode(),
                  os.path.basename(source_path).encode(), len(headers), texts, names),
           "creating a program")
    try:
        options = [b"--gpu-architecture=sm_%d" % arch, b"--std=c++14"]
        if compile_(program, len(options), (c * len(options))(*options)) != 0:
            size = ctypes.c_size_t()
            log_size(program, ctypes.byref(size))
            log = ctypes.create_string_buffer(max(1, size.value))
            get_log(program, log)
            raise nvrtc.NVRTCError("NVRTC could not compile %s for sm_%d:\n%s"
                                   % (source_path, arch, log.value.decode(errors="replace")))
        size = ctypes.c_size_t()
        _check(cubin_size(program, ctypes.byref(size)), "sizing the CUBIN")
        image = ctypes.create_string_buffer(size.value)
        _check(get_cubin(program, image), "reading the CUBIN")
        return image.raw
    finally:
        destroy(ctypes.byref(program))


def _function(lib, name, argtypes):
    """A private prototype of one NVRTC function (the binding's own stay untouched)."""
    return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)((name, lib))


def _check(status, doing):
    if status != 0:
        raise nvrtc.NVRTCError("NVRTC failed %s (status %d)" % (doing, status))
