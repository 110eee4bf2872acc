"""Where NVIDIA's shared libraries are found: an explicit path, NVIDIA's wheels, the toolkit.

NVRTC and cuBLAS come either with a CUDA toolkit (CUDA_HOME, CUDA_PATH, /usr/local/cuda, the
loader's cache) or as pip wheels, in two layouts: CUDA 12's (``nvidia-cuda-nvrtc-cu12`` puts
``site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12``) and CUDA 13's (``nvidia-cuda-nvrtc``
puts every library in ``site-packages/nvidia/cu13/lib``). Nothing here decides which version
to use; it lists the candidates, each with the major version its file name carries, so a
caller can choose by the driver's version and say everywhere it looked.
"""
import ctypes
import ctypes.util
import glob
import importlib.util
import os
import re

TOOLKIT_ROOTS = ("CUDA_HOME", "CUDA_PATH")
# the wheels of each CUDA major, for the message that says what to install
WHEELS = {"nvrtc": {12: "nvidia-cuda-nvrtc-cu12", 13: "nvidia-cuda-nvrtc"},
          "cublas": {12: "nvidia-cublas-cu12", 13: "nvidia-cublas"}}
CU12_PARTS = {"nvrtc": "cuda_nvrtc", "cublas": "cublas"}


def _package_dirs(name):
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    return list(spec.submodule_search_locations or []) if spec is not None else []


def wheel_lib_dirs(stem):
    """lib folders of NVIDIA's wheels that may hold lib``stem``: ``nvidia/cu13/lib`` (and any
    ``nvidia/cuNN/lib``), then CUDA 12's ``nvidia/<part>/lib``."""
    dirs = []
    for root in _package_dirs("nvidia"):
        dirs += sorted(glob.glob(os.path.join(root, "cu[0-9]*", "lib")), reverse=True)
    part = CU12_PARTS.get(stem)
    if part:
        dirs += [os.path.join(p, "lib") for p in _package_dirs("nvidia." + part)]
    return [d for d in dirs if os.path.isdir(d)]


def toolkit_lib_dirs():
    roots = [os.environ[name] for name in TOOLKIT_ROOTS if os.environ.get(name)]
    roots.append("/usr/local/cuda")
    dirs = []
    for root in roots:
        for sub in ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib")):
            path = os.path.join(root, sub)
            if os.path.isdir(path) and path not in dirs:
                dirs.append(path)
    return dirs


def major_of(path, stem):
    """The major version in a library's file name (libnvrtc.so.13 -> 13), or None."""
    match = re.search(r"lib%s\.so\.(\d+)" % re.escape(stem), os.path.basename(path))
    return int(match.group(1)) if match else None


def _versioned(folder, stem):
    """libSTEM.so.MAJOR[.x...] files in ``folder``, one per major (its shortest name)."""
    # the "alt" builds of the wheels are a second copy for static-linking users; skip them
    names = sorted((p for p in glob.glob(os.path.join(folder, "lib%s.so.*" % stem))
                    if ".alt." not in p), key=len)
    chosen = {}
    for path in names:
        chosen.setdefault(major_of(path, stem), path)
    return [p for m, p in chosen.items() if m is not None]


def candidates(stem, env_var, wheel_first=True):
    """Paths to try for lib``stem``: ``env_var`` alone when set; else the wheels' and the
    toolkit's (in the order ``wheel_first`` says), then the loader's name."""
    if os.environ.get(env_var):
        return [os.environ[env_var]]
    wheel = [p for d in wheel_lib_dirs(stem) for p in _versioned(d, stem)]
    toolkit = [p for d in toolkit_lib_dirs() for p in _versioned(d, stem)]
    found, seen = [], set()
    for path in (wheel + toolkit) if wheel_first else (toolkit + wheel):
        real = os.path.realpath(path)          # a toolkit's lib64 is often a link to another
        if real not in seen:
            seen.add(real)
            found.append(path)
    name = ctypes.util.find_library(stem)
    if name and name not in found:
        found.append(name)
    return found


def by_major(paths, stem, max_major=None):
    """``paths`` newest major first (stable within a major), without those above
    ``max_major`` (a library newer than the driver's CUDA does not run on it)."""
    known = [(major_of(p, stem) or 0, i, p) for i, p in enumerate(paths)]
    kept = [k for k in known if max_major is None or k[0] <= max_major]
    return [p for _, _, p in sorted(kept, key=lambda k: (-k[0], k[1]))]


def preload_companions(path, stem):
    """Load the libraries beside ``path`` that it opens by name at run time without a
    RUNPATH to find them (CUDA 13's libnvrtc and its libnvrtc-builtins)."""
    folder = os.path.dirname(path)
    if not folder:
        return
    for companion in sorted(glob.glob(os.path.join(folder, "lib%s-builtins.so.*" % stem)),
                            key=len)[:1]:
        try:
            ctypes.CDLL(companion, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            pass                      # the library's own load then says what is missing


def install_hint(stem, env_var, driver_major=None):
    """What to install (or set) when no lib``stem`` loads."""
    wheels = WHEELS[stem]
    wheel = wheels.get(driver_major) or wheels[max(wheels)]
    return "pip install %s (or a CUDA toolkit), or set %s to the library's path" % (wheel, env_var)


def load(stem, env_var, what, wheel_first=True, max_major=None):
    """The first candidate that loads, as a ctypes.CDLL; OSError naming every place tried."""
    tried = []
    paths = by_major(candidates(stem, env_var, wheel_first), stem,
                     None if os.environ.get(env_var) else max_major)
    for path in paths:
        try:
            preload_companions(path, stem)
            return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            tried.append("%s (%s)" % (path, exc))
    where = "; ".join(tried) if tried else "no lib%s found%s" % (
        stem, "" if max_major is None else " for CUDA %d or older" % max_major)
    raise OSError("%s is not available: %s. %s" % (what, where,
                                                   install_hint(stem, env_var, max_major)))
