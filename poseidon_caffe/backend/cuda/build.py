"""Kernel sources -> what a driver loads: PTX through NVRTC, or a host shared library.

The kernels are ``kernels/*.cu``, each including ``kernels/common.cuh``. The same source builds
two ways:

- for a device: NVRTC compiles it to a CUBIN for the GPU's own architecture (sm_90), or to
  PTX for a virtual one (compute_70...) that the CUDA driver finishes at load time (images.py
  chooses);
- for the host: the system C++ compiler builds it into a shared library, where the header makes
  every kernel a plain C function whose grid-stride loop runs over all indices (the emulated
  driver calls these).

Both results are cached on disk, keyed by a hash of the source and header text, the target and
the compiler's version, under POSEIDON_CAFFE_CACHE (default ``$XDG_CACHE_HOME/poseidon-caffe``
or ``~/.cache/poseidon-caffe``). Cache files are written beside their final name and renamed in,
so a reader never sees half a file and concurrent builders do not disturb each other.
"""
import hashlib
import os
import re
import shutil
import socket
import subprocess
import tempfile

KERNEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
HEADER = "common.cuh"
CACHE_ENV = "POSEIDON_CAFFE_CACHE"
CXX_ENV = "CXX"
HOST_FLAGS = ("-O2", "-shared", "-fPIC", "-std=c++14", "-Wall", "-Werror",
              # one rounding per operation, as numpy's float32 arithmetic does
              "-ffp-contract=off", "-fno-fast-math")
# NVRTC warns that it will drop an old target one day; this says nothing about the source
TARGET_DEPRECATION = re.compile(r"^nvrtc: warning ?: .*(Architectures? prior to|architecture|"
                                r"target).*(deprecated|removed).*$", re.M | re.I)


class BuildError(RuntimeError):
    """A kernel source that does not compile, or no compiler to compile it."""


def sources():
    """{module name: path} of every kernel source (``im2col`` -> kernels/im2col.cu)."""
    return {name[:-3]: os.path.join(KERNEL_DIR, name)
            for name in sorted(os.listdir(KERNEL_DIR)) if name.endswith(".cu")}


def headers():
    """{include name: text} of the headers every kernel source may include."""
    return {name: _read(os.path.join(KERNEL_DIR, name))
            for name in sorted(os.listdir(KERNEL_DIR)) if name.endswith(".cuh")}


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def cache_dir():
    root = os.environ.get(CACHE_ENV)
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                ".cache")
        root = os.path.join(base, "poseidon-caffe")
        if not _writable(root):
            # a read-only home (a container, a service account): a private temporary cache
            root = os.path.join(tempfile.gettempdir(), "poseidon-caffe-%d" % os.getuid())
    return os.path.join(root, "kernels")


def _writable(root):
    try:
        os.makedirs(root, exist_ok=True)
    except OSError:
        return False
    return os.access(root, os.W_OK)


def _key(*parts):
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else str(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:24]


def write_atomic(path, data):
    """Write ``data`` to a temporary beside ``path`` (named by pid and host), then rename it in."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = "%s.tmp-%d-%s" % (path, os.getpid(), socket.gethostname())
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


# -- device images (PTX or CUBIN) -------------------------------------------------------------
def compile_image(source_path, arch, compiler=None, cubin=False):
    """(image bytes, log) of one kernel source for compute capability ``arch`` (70, 90...):
    PTX for compute_<arch>, or with ``cubin`` machine code for sm_<arch>; uncached. Raises
    BuildError when NVRTC is missing or the source does not compile."""
    from .nvrtc import NVRTCError, nvrtc
    try:
        compiler = compiler or nvrtc()
        return compiler.compile(_read(source_path), os.path.basename(source_path), arch,
                                headers=headers(), cubin=cubin)
    except NVRTCError as exc:
        raise BuildError(str(exc)) from None


def compile_ptx(source_path, arch, compiler=None):
    """(ptx bytes, log): compile_image's PTX."""
    return compile_image(source_path, arch, compiler)


def source_warnings(log):
    """The warnings of an NVRTC log that concern the source (the target notice left out)."""
    return TARGET_DEPRECATION.sub("", log).strip()


def image(source_path, arch, cubin=False, compiler=None):
    """PTX (or with ``cubin`` a CUBIN) of one kernel source for compute capability ``arch``,
    from the cache when built; ``compiler`` an NVRTC (default the newest installed)."""
    from .nvrtc import NVRTCError, nvrtc
    try:
        compiler = compiler or nvrtc()
    except NVRTCError as exc:
        raise BuildError(str(exc)) from None
    text = _read(source_path)
    kind = "cubin" if cubin else "ptx"
    key = _key(kind, text, sorted(headers().items()), arch, compiler.version())
    path = os.path.join(cache_dir(), "%s-%s%d-%s.%s" % (
        os.path.basename(source_path)[:-3], "sm" if cubin else "compute", arch, key, kind))
    if os.path.exists(path):
        with open(path, "rb") as f:
            return f.read()
    code, _ = compile_image(source_path, arch, compiler, cubin)
    write_atomic(path, code)
    return code


def ptx(source_path, arch):
    """PTX of one kernel source for compute capability ``arch`` (cached)."""
    return image(source_path, arch)


def best_arch(capability, supported):
    """The newest architecture in ``supported`` not above the device's ``capability`` (major,
    minor): PTX for it runs on the device (the driver compiles it further)."""
    cc = capability[0] * 10 + capability[1]
    fitting = [a for a in supported if a <= cc]
    if not fitting:
        raise BuildError("the device's compute capability %d.%d is below every architecture "
                         "this NVRTC targets (%s)" % (capability[0], capability[1],
                                                       ", ".join(map(str, supported))))
    return max(fitting)


# -- host build -----------------------------------------------------------------------------
def host_compiler():
    """The C++ compiler command for host builds ($CXX, else c++ or g++), or None."""
    name = os.environ.get(CXX_ENV)
    if name:
        return shutil.which(name) or name
    for candidate in ("c++", "g++", "clang++"):
        found = shutil.which(candidate)
        if found:
            return found
    return None


def _compiler_version(cxx):
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError("the C++ compiler %s does not run: %s" % (cxx, exc)) from None
    return out.stdout.splitlines()[0] if out.stdout else ""


def host_library(source_path, extra_flags=()):
    """Path of the host shared library built from one kernel source (cached)."""
    cxx = host_compiler()
    if cxx is None:
        raise BuildError("no C++ compiler found for the host build of the kernels "
                         "(install g++ or set CXX)")
    flags = list(HOST_FLAGS) + list(extra_flags)
    key = _key("host", _read(source_path), sorted(headers().items()), flags,
               _compiler_version(cxx))
    path = os.path.join(cache_dir(), "%s-host-%s.so" % (os.path.basename(source_path)[:-3], key))
    if os.path.exists(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(path)) as work:
        out = os.path.join(work, "kernels.so")
        command = [cxx] + flags + ["-I", KERNEL_DIR, "-x", "c++", source_path, "-o", out]
        try:
            run = subprocess.run(command, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.SubprocessError) as exc:
            raise BuildError("the C++ compiler %s does not run: %s" % (cxx, exc)) from None
        if run.returncode != 0:
            raise BuildError("host build of %s failed:\n%s" % (source_path,
                                                                 run.stderr.strip()))
        tmp = "%s.tmp-%d-%s" % (path, os.getpid(), socket.gethostname())
        os.replace(out, tmp)
        os.replace(tmp, path)
    return path
