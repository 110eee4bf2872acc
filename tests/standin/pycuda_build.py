"""pycuda from its sdist, built against the stand-in libcuda (or a machine's real one), so that
the pycuda driver runs where no pycuda wheel exists.

pycuda publishes no wheel, and its extension links against libcuda.so.

- ``pycuda_site(standin)`` builds PYCUDA once per Python, pycuda version and CUDA headers:
  the sdist from pip, built against the stand-in's headers and library folder, then pip
  installs pycuda's pure-Python needs beside it (those the running environment lacks, so
  nothing it has is shadowed). The folder returned goes on PYTHONPATH; at run time pycuda's
  _driver finds the stand-in libcuda.so.1 through LD_LIBRARY_PATH (StandIn.environ()).
- ``build_into(sdist, site)`` builds one sdist into ``site`` against a machine's own CUDA (a
  toolkit's or NVIDIA's wheels' headers, the loader's libcuda.so.1): what a GPU machine
  without network does with a carried sdist. This module then runs without its package
  (scripts/gpu_check.py imports it from tests/standin alone).

Either way: configured without cuRAND, compiled with -g0 and every C++ file in parallel
(parallel_setup.py). It takes about 75 s on 2 idle cores (most of it one file,
wrap_cudadrv.cpp); later pycuda_site calls find it built.
"""
import glob
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile

try:
    from .errors import StandInUnavailable
except ImportError:                     # imported alone, with tests/standin on sys.path
    from errors import StandInUnavailable

HERE = os.path.dirname(os.path.abspath(__file__))
PYCUDA = "pycuda==2026.1"
# pycuda's and pytools' requirements (mako brings MarkupSafe)
NEEDS = ("pytools>=2024.1.2", "mako", "MarkupSafe>=0.9.2", "platformdirs>=2.2",
         "siphash24>=1.6", "typing-extensions>=4.5")
BUILD_TOOLS = ("setuptools>=61",)
PYCUDA_HEADERS = ("cuda.h", "cudaProfiler.h")
LIBCUDA_PLACES = ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1",
                  "/usr/local/nvidia/lib64/libcuda.so.1", "/usr/lib/wsl/lib/libcuda.so.1")


def pycuda_site(standin, cache_dir=None, jobs=None):
    """A folder to put on PYTHONPATH holding an importable PYCUDA built against ``standin``
    (built on the first call); StandInUnavailable naming what is missing."""
    from . import headers
    from .build import cache_root
    root = cache_root(cache_dir)
    include = [headers.extra_include_dir(root), standin.include_dir]
    needs = missing(NEEDS)
    key = hashlib.sha256()
    for part in [sys.version, sysconfig.get_platform(), PYCUDA, repr(needs)] + [
            _read(os.path.join(folder, name)) for folder, name in
            [(standin.include_dir, "cuda.h"), (include[0], "cudaProfiler.h"),
             (HERE, "parallel_setup.py"), (HERE, "pycuda_build.py")]]:
        key.update(part if isinstance(part, bytes) else part.encode())
        key.update(b"\0")
    site = os.path.join(root, "pycuda-%s-%s" % (sys.implementation.cache_tag,
                                                key.hexdigest()[:16]))
    if os.path.isdir(site):
        return site
    os.makedirs(root, exist_ok=True)
    work = tempfile.mkdtemp(prefix="pycuda-build-", dir=root)
    try:
        built = os.path.join(work, "site")
        build_into(_sdist(work, _build_env(work)), built, include, standin.lib_dir, jobs)
        if needs:
            _pip(["install", "--target", built, "--no-deps", "--only-binary=:all:"] + needs)
        try:
            os.rename(built, site)
        except OSError:
            if not os.path.isdir(site):             # not a concurrent build: a real error
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return site


def build_into(sdist, site, include_dirs=None, lib_dir=None, jobs=None):
    """pycuda from the ``sdist`` archive, built and copied into ``site`` (its package only);
    by default against this machine's CUDA headers and libcuda.so.1."""
    _check_tools()
    include_dirs = list(include_dirs or [cuda_include_dir()])
    work = tempfile.mkdtemp(prefix="pycuda-src-")
    try:
        if lib_dir is None:
            lib_dir = os.path.join(work, "lib")
            os.makedirs(lib_dir)
            os.symlink(libcuda_path(), os.path.join(lib_dir, "libcuda.so"))
        env = dict(_build_env(work), CFLAGS="-g0", JOBS=str(jobs or os.cpu_count() or 1))
        source = _unpack(sdist, work)
        root = os.path.dirname(include_dirs[-1])
        _run([sys.executable, "configure.py", "--cuda-root=" + root,
              "--cuda-inc-dir=" + ",".join(include_dirs), "--cudadrv-lib-dir=" + lib_dir,
              "--no-cuda-enable-curand"], source, env)
        _run([sys.executable, os.path.join(HERE, "parallel_setup.py"), "build_ext", "--inplace"],
             source, env)
        target = os.path.join(site, "pycuda")
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(os.path.join(source, "pycuda"), target,
                        ignore=shutil.ignore_patterns("__pycache__"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return site


def include_candidates(wheel_first=False):
    """Folders that may hold CUDA's headers: a toolkit's (CUDA_HOME, CUDA_PATH,
    /usr/local/cuda) and NVIDIA's cu13 wheels' (site-packages/nvidia/cu13/include)."""
    roots = [os.environ[name] for name in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(name)]
    toolkit = [os.path.join(root, "include") for root in roots + ["/usr/local/cuda"]]
    try:
        spec = importlib.util.find_spec("nvidia.cu13")
    except (ImportError, ValueError):
        spec = None
    wheel = [os.path.join(p, "include") for p in (spec.submodule_search_locations or ())
             ] if spec is not None else []
    return wheel + toolkit if wheel_first else toolkit + wheel


def cuda_include_dir():
    """A folder holding cuda.h and cudaProfiler.h: a toolkit's, else NVIDIA's cu13 wheels'."""
    for folder in include_candidates():
        if all(os.path.isfile(os.path.join(folder, h)) for h in PYCUDA_HEADERS):
            return folder
    raise StandInUnavailable("no CUDA headers to build pycuda against (%s): set CUDA_HOME "
                             "to a toolkit" % " and ".join(PYCUDA_HEADERS))


def libcuda_path():
    """The driver's libcuda.so.1, as the loader's cache or the usual places have it."""
    try:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    except OSError:
        cache = ""
    found = [line.rsplit("=> ", 1)[1].strip() for line in cache.splitlines()
             if line.strip().startswith("libcuda.so.1 ") and "=> " in line]
    for path in found + list(LIBCUDA_PLACES):
        if os.path.exists(path):
            return path
    raise StandInUnavailable("no libcuda.so.1 to link pycuda against (no NVIDIA driver)")


def missing(requirements):
    """The requirements the running environment does not satisfy."""
    from packaging.requirements import Requirement
    lacking = []
    for text in requirements:
        requirement = Requirement(text)
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            version = None
        if version is None or not requirement.specifier.contains(version, prereleases=True):
            lacking.append(text)
    return lacking


def _build_env(work):
    """os.environ, with setuptools installed into ``work`` when the environment lacks it."""
    env = dict(os.environ)
    tools = missing(BUILD_TOOLS)
    if tools:
        _pip(["install", "--target", os.path.join(work, "tools")] + tools)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(work, "tools"),
                                                          env.get("PYTHONPATH")]))
    return env


def _check_tools():
    cxx = os.environ.get("CXX") or "g++"
    if not shutil.which(cxx):
        raise StandInUnavailable("no C++ compiler to build pycuda (apt-get install g++)")
    python_h = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    if not os.path.isfile(python_h):
        raise StandInUnavailable("Python.h is missing for %s, which building pycuda needs "
                                 "(apt-get install python3-dev)" % sys.executable)


def _sdist(work, env):
    """PYCUDA's sdist, from pip (a mirror or wheel folder pip is set up with serves it too)."""
    download = os.path.join(work, "sdist")
    # pip reads the sdist's metadata with the build tools at hand: an isolated build
    # environment would build numpy from source for it
    _pip(["download", "--no-deps", "--no-binary=pycuda", "--no-build-isolation", "-d",
          download, PYCUDA], env)
    archives = glob.glob(os.path.join(download, "pycuda-*.tar.gz"))
    if not archives:
        raise StandInUnavailable("pip downloaded no sdist of %s" % PYCUDA)
    return archives[0]


def _unpack(sdist, work):
    """The folder of the unpacked sdist."""
    with tarfile.open(sdist) as archive:
        if hasattr(tarfile, "data_filter"):
            archive.extractall(work, filter="data")
        else:
            archive.extractall(work)
    folders = [p for p in glob.glob(os.path.join(work, "pycuda-*")) if os.path.isdir(p)]
    if not folders:
        raise StandInUnavailable("%s holds no pycuda-* folder" % sdist)
    return folders[0]


def _pip(arguments, env=None):
    run = subprocess.run([sys.executable, "-m", "pip", "--quiet"] + arguments,
                         capture_output=True, text=True, env=env, timeout=600)
    if run.returncode != 0:
        lines = [line for line in run.stderr.splitlines() if line.strip()]
        raise StandInUnavailable("pip %s failed: %s" % (arguments[0], lines[-1] if lines else
                                                         "exit status %d" % run.returncode))


def _run(command, cwd, env):
    run = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=1800)
    if run.returncode != 0:
        raise RuntimeError("building pycuda failed (%s):\n%s" % (
            " ".join(command), (run.stdout + run.stderr).strip()[-4000:]))


def _read(path):
    with open(path, "rb") as f:
        return f.read()
