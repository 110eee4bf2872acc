"""Builds the stand-in driver libraries and what they run, once per content, and says how a
process uses them.

``prepare()`` compiles libcuda.so.1 (with the entry points generated from the headers) and
libcublas.so.13 into a folder named by a hash of their sources, the headers and the compiler,
builds the host library of every kernel source (build.host_library, cached by the backend),
and writes the kernels' signatures (launch.source_signatures) for CUBIN modules. A second
call finds everything built and costs a few hashes. The environment variables of the
returned StandIn are what a subprocess needs to run a real driver over the stand-ins: they
must be set before it starts (the loader reads LD_LIBRARY_PATH once).
"""
import concurrent.futures
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from poseidon_caffe.backend.cuda import build as kernel_build
from poseidon_caffe.backend.cuda import launch

from . import entry_points, headers
from .errors import StandInUnavailable

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ("libcuda.c", "libcublas.c", "entry_points.h", "entry_points.py", "build.py")
CFLAGS = ("-std=gnu11", "-O3", "-g0", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared",
          "-ffp-contract=off", "-Wl,--no-undefined")
HOST_LIBS_ENV = "STANDIN_CUDA_HOST_LIBS"
SIGNATURES_ENV = "STANDIN_CUDA_SIGNATURES"
CUBLAS_ENV = "POSEIDON_CAFFE_CUBLAS"


@dataclass(frozen=True)
class StandIn:
    """The built stand-ins: ``lib_dir`` holds libcuda.so.1 (and the libcuda.so link a build
    links against) and libcublas.so.13; ``include_dir`` the CUDA headers they were built
    against; ``host_libs`` the kernels' host builds; ``signatures`` their parameter kinds."""
    lib_dir: str
    include_dir: str
    host_libs: tuple
    signatures: str

    @property
    def libcuda(self):
        return os.path.join(self.lib_dir, "libcuda.so.1")

    @property
    def libcublas(self):
        return os.path.join(self.lib_dir, "libcublas.so.13")

    @property
    def env(self):
        """The variables a process needs (LD_LIBRARY_PATH: the stand-ins' folder alone)."""
        return {"LD_LIBRARY_PATH": self.lib_dir, CUBLAS_ENV: self.libcublas,
                HOST_LIBS_ENV: os.pathsep.join(self.host_libs), SIGNATURES_ENV: self.signatures}

    def environ(self, base=None):
        """``base`` (default os.environ) with ``env`` set, the stand-ins' folder first on
        LD_LIBRARY_PATH."""
        environ = dict(os.environ if base is None else base)
        previous = environ.get("LD_LIBRARY_PATH")
        environ.update(self.env)
        if previous:
            environ["LD_LIBRARY_PATH"] = self.lib_dir + os.pathsep + previous
        return environ


def cache_root(cache_dir=None):
    """Where the stand-ins are kept: ``cache_dir``, else $POSEIDON_CAFFE_CACHE/standin, else
    ~/.cache/poseidon-caffe/standin (the backend's cache root)."""
    return cache_dir or os.path.join(os.path.dirname(kernel_build.cache_dir()), "standin")


def c_compiler():
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        found = name and shutil.which(name)
        if found:
            return found
    raise StandInUnavailable("no C compiler for the stand-ins (apt-get install gcc, or set CC)")


def prepare(cache_dir=None):
    """The stand-ins, built (or found built) under ``cache_dir``; StandInUnavailable naming
    what is missing when a tool, a library or a header is."""
    root = cache_root(cache_dir)
    cc = c_compiler()
    include = headers.cuda_include_dir()
    extra_include = headers.extra_include_dir(root)
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        libraries = pool.submit(_libraries, root, cc, include, extra_include)
        host_libs = [pool.submit(_host_library, path)
                     for path in kernel_build.sources().values()]
        lib_dir = libraries.result()
        host_libs = tuple(f.result() for f in host_libs)
    return StandIn(lib_dir, include, host_libs, _signatures(root))


def _host_library(path):
    try:
        return kernel_build.host_library(path)
    except kernel_build.BuildError as exc:
        if kernel_build.host_compiler() is None:
            raise StandInUnavailable(str(exc)) from None
        raise


def _signatures(root):
    """A file of "kernel signature" lines for every kernel of the sources."""
    text = "".join("%s %s\n" % item for module in launch.source_signatures().values()
                   for item in sorted(module.items()))
    path = os.path.join(root, "signatures-%s.txt" % _digest([text.encode()]))
    if not os.path.exists(path):
        kernel_build.write_atomic(path, text.encode())
    return path


def _digest(parts):
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _libraries(root, cc, include, extra_include):
    """The folder of libcuda.so.1, libcuda.so and libcublas.so.13, built when missing."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    inputs = [_read(os.path.join(HERE, name)) for name in SOURCES]
    inputs += [_read(os.path.join(include, name)) for name in headers.DRIVER_HEADERS]
    inputs += [_read(os.path.join(d, f)) for d, _, files in sorted(os.walk(extra_include))
               for f in sorted(files)]
    inputs += [version.encode(), " ".join(CFLAGS).encode()]
    folder = os.path.join(root, "lib-" + _digest(inputs))
    if os.path.exists(os.path.join(folder, "libcublas.so.13")):
        return folder
    os.makedirs(root, exist_ok=True)
    work = tempfile.mkdtemp(prefix="lib-build-", dir=root)
    os.chmod(work, 0o755)
    try:
        generated = os.path.join(work, "entry_points.c")
        with open(generated, "w", encoding="utf-8") as f:
            f.write(entry_points.generate([extra_include, include], cc))
        _compile(cc, ["-I", include, "-I", HERE, os.path.join(HERE, "libcuda.c"), generated,
                      "-o", os.path.join(work, "libcuda.so.1"), "-Wl,-soname,libcuda.so.1",
                      "-lffi", "-ldl", "-lpthread"])
        _compile(cc, ["-I", extra_include, "-I", include, os.path.join(HERE, "libcublas.c"),
                      "-o", os.path.join(work, "libcublas.so.13"),
                      "-Wl,-soname,libcublas.so.13", "-ldl"])
        os.symlink("libcuda.so.1", os.path.join(work, "libcuda.so"))
        try:
            os.rename(work, folder)
        except OSError:
            if not os.path.exists(os.path.join(folder, "libcublas.so.13")):
                raise                                  # not a concurrent build: a real error
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder


def _compile(cc, arguments):
    run = subprocess.run([cc] + list(CFLAGS) + arguments, capture_output=True, text=True,
                         timeout=600)
    if run.returncode == 0:
        return
    if "ffi.h" in run.stderr or "-lffi" in run.stderr:
        raise StandInUnavailable("libffi's development files are missing "
                                 "(apt-get install libffi-dev)")
    raise RuntimeError("building a stand-in failed:\n%s\n%s" % (" ".join(arguments),
                                                                 run.stderr.strip()))
