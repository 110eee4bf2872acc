"""NVRTC, NVIDIA's runtime compiler, through ctypes: CUDA C++ source -> PTX or CUBIN, without
a GPU.

Several NVRTCs may be installed (CUDA 12's wheel, CUDA 13's, a toolkit's): ``compilers()``
loads each once, newest major first, so a caller can pick one the driver accepts (images.py)
and the tests can pick one that still targets sm_70 (NVRTC 13 dropped it).
POSEIDON_CAFFE_NVRTC names one library explicitly, and then it is the only one.
"""
import ctypes

from . import libraries

ENV = "POSEIDON_CAFFE_NVRTC"

NVRTC_SUCCESS = 0


class NVRTCError(RuntimeError):
    """A compile that failed (the message holds NVRTC's log) or a library that is missing."""


class NVRTC:
    def __init__(self, lib=None):
        if lib is None:
            try:
                lib = libraries.load("nvrtc", ENV, "NVRTC")
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
        self.writes_cubin = hasattr(lib, "nvrtcGetCUBIN")
        if self.writes_cubin:
            lib.nvrtcGetCUBINSize.argtypes = [p, ctypes.POINTER(ctypes.c_size_t)]
            lib.nvrtcGetCUBIN.argtypes = [p, c]
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

    def compile(self, source, name, arch, headers=None, options=(), cubin=False):
        """(image bytes, log text) of ``source`` for compute capability ``arch`` (e.g. 70):
        PTX for the virtual architecture compute_<arch>, or with ``cubin`` the machine code
        for sm_<arch> (an ELF image the driver loads as it is).

        ``headers`` maps include names to their text. A failed compile raises NVRTCError with
        the log; a successful one returns its log too (warnings would be there)."""
        if cubin and not self.writes_cubin:
            raise NVRTCError("NVRTC %d.%d at %s cannot write CUBIN" % (self.version() +
                                                                      (self.path,)))
        target = "%s_%d" % ("sm" if cubin else "compute", arch)
        headers = headers or {}
        prog = ctypes.c_void_p()
        names = (ctypes.c_char_p * max(1, len(headers)))(*[k.encode() for k in headers])
        texts = (ctypes.c_char_p * max(1, len(headers)))(*[v.encode() for v in
                                                              headers.values()])
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(),
                                                name.encode(), len(headers), texts, names),
                    "creating a program for %s" % name)
        try:
            opts = ["--gpu-architecture=%s" % target, "--std=c++14"] + list(options)
            argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
            status = self.lib.nvrtcCompileProgram(prog, len(opts), argv)
            log = self._log(prog)
            if status != NVRTC_SUCCESS:
                message = self.lib.nvrtcGetErrorString(status).decode()
                raise NVRTCError("NVRTC could not compile %s for %s (%s):\n%s"
                                 % (name, target, message, log))
            kind = "CUBIN" if cubin else "PTX"
            size = ctypes.c_size_t()
            self._check(getattr(self.lib, "nvrtcGet%sSize" % kind)(prog, ctypes.byref(size)),
                        "sizing " + kind)
            buf = ctypes.create_string_buffer(size.value)
            self._check(getattr(self.lib, "nvrtcGet" + kind)(prog, buf), "reading " + kind)
            return (buf.raw if cubin else buf.raw.rstrip(b"\0")), log
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))

    def _log(self, prog):
        size = ctypes.c_size_t()
        self._check(self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "sizing the log")
        buf = ctypes.create_string_buffer(max(1, size.value))
        self._check(self.lib.nvrtcGetProgramLog(prog, buf), "reading the log")
        return buf.value.decode(errors="replace").strip()


_loaded = {}                   # path -> NVRTC, or the OSError text of a path that did not load


def compilers():
    """Every NVRTC that loads, newest major first (POSEIDON_CAFFE_NVRTC: that one only);
    NVRTCError naming each place tried when none does."""
    found, tried = [], []
    paths = libraries.by_major(libraries.candidates("nvrtc", ENV), "nvrtc")
    for path in paths:
        if path not in _loaded:
            try:
                libraries.preload_companions(path, "nvrtc")
                _loaded[path] = NVRTC(ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL))
            except (OSError, AttributeError) as exc:
                _loaded[path] = "%s (%s)" % (path, exc)
        (found if isinstance(_loaded[path], NVRTC) else tried).append(_loaded[path])
    if not found:
        raise NVRTCError("NVRTC is not available: %s. %s" % (
            "; ".join(tried) if tried else "no libnvrtc found",
            libraries.install_hint("nvrtc", ENV)))
    return found


def nvrtc(max_major=None):
    """The newest NVRTC (not above CUDA ``max_major`` when given), loaded on first use."""
    fitting = [c for c in compilers() if max_major is None or c.version()[0] <= max_major]
    if not fitting:
        raise NVRTCError("no NVRTC for CUDA %d or older is installed (found %s). %s" % (
            max_major, ", ".join("%d.%d" % c.version() for c in compilers()),
            libraries.install_hint("nvrtc", ENV, max_major)))
    return fitting[0]
