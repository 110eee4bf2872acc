"""NVRTC, NVIDIA's runtime compiler, through ctypes: CUDA C++ source -> PTX, without a GPU.

The ``nvidia-cuda-nvrtc-cu12`` wheel is looked for first: NVRTC 13 no longer targets sm_70,
which the kernels still support. POSEIDON_CAFFE_NVRTC names a library explicitly.
"""
import ctypes

from . import libraries

NVRTC_SUCCESS = 0


class NVRTCError(RuntimeError):
    """A compile that failed (the message holds NVRTC's log) or a library that is missing."""


class NVRTC:
    def __init__(self, lib=None):
        if lib is None:
            try:
                lib = libraries.load("nvrtc", "cuda_nvrtc", "POSEIDON_CAFFE_NVRTC", "NVRTC",
                                     major=12)
            except OSError as exc:
                raise NVRTCError(str(exc)) from None
        self.lib = lib
        p, c = ctypes.c_void_p, ctypes.c_char_p
        lib.nvrtcGetErrorString.restype = c
        lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
        lib.nvrtcVersion.argtypes = [ctypes.POINTER(ctypes.c_int)] * 2
        lib.nvrtcCreateProgram.argtypes = [ctypes.POINTER(p), c, c, ctypes.c_int,
                                           ctypes.POINTER(c), ctypes.POINTER(c)]
        lib.nvrtcCompileProgram.argtypes = [p, ctypes.c_int, ctypes.POINTER(c)]
        lib.nvrtcGetProgramLogSize.argtypes = [p, ctypes.POINTER(ctypes.c_size_t)]
        lib.nvrtcGetProgramLog.argtypes = [p, c]
        lib.nvrtcGetPTXSize.argtypes = [p, ctypes.POINTER(ctypes.c_size_t)]
        lib.nvrtcGetPTX.argtypes = [p, c]
        lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(p)]
        self.path = getattr(lib, "_name", "")

    def _check(self, status, doing):
        if status != NVRTC_SUCCESS:
            message = self.lib.nvrtcGetErrorString(status).decode()
            raise NVRTCError("NVRTC failed %s: %s" % (doing, message))

    def version(self):
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "version")
        return major.value, minor.value

    def supported_archs(self):
        """Compute capabilities this NVRTC compiles for, as integers (70, 75, ..., 90)."""
        fn_num = getattr(self.lib, "nvrtcGetNumSupportedArchs", None)
        if fn_num is None:                   # before CUDA 11.2: assume the usual range
            return [70, 75, 80, 86]
        count = ctypes.c_int()
        self._check(fn_num(ctypes.byref(count)), "listing architectures")
        archs = (ctypes.c_int * count.value)()
        self._check(self.lib.nvrtcGetSupportedArchs(archs), "listing architectures")
        return list(archs)

    def compile(self, source, name, arch, headers=None, options=()):
        """(ptx bytes, log text) of ``source`` for compute capability ``arch`` (e.g. 70).

        ``headers`` maps include names to their text. A failed compile raises NVRTCError with
        the log; a successful one returns its log too (warnings would be there)."""
        headers = headers or {}
        prog = ctypes.c_void_p()
        names = (ctypes.c_char_p * max(1, len(headers)))(*[k.encode() for k in headers])
        texts = (ctypes.c_char_p * max(1, len(headers)))(*[v.encode() for v in
                                                              headers.values()])
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(),
                                                name.encode(), len(headers), texts, names),
                    "creating a program for %s" % name)
        try:
            opts = ["--gpu-architecture=compute_%d" % arch, "--std=c++14"] + list(options)
            argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
            status = self.lib.nvrtcCompileProgram(prog, len(opts), argv)
            log = self._log(prog)
            if status != NVRTC_SUCCESS:
                message = self.lib.nvrtcGetErrorString(status).decode()
                raise NVRTCError("NVRTC could not compile %s for compute_%d (%s):\n%s"
                                 % (name, arch, message, log))
            size = ctypes.c_size_t()
            self._check(self.lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "sizing PTX")
            buf = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetPTX(prog, buf), "reading PTX")
            return buf.raw.rstrip(b"\0"), log
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))

    def _log(self, prog):
        size = ctypes.c_size_t()
        self._check(self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "sizing the log")
        buf = ctypes.create_string_buffer(max(1, size.value))
        self._check(self.lib.nvrtcGetProgramLog(prog, buf), "reading the log")
        return buf.value.decode(errors="replace").strip()


_shared = []


def nvrtc():
    """The process's NVRTC, loaded on first use (NVRTCError when it cannot be found)."""
    if not _shared:
        _shared.append(NVRTC())
    return _shared[0]
