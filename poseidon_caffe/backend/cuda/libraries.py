"""Where NVIDIA's shared libraries are found: an explicit path, NVIDIA's wheels, the toolkit.

NVRTC and cuBLAS come either with a CUDA toolkit (CUDA_HOME, CUDA_PATH, /usr/local/cuda, the
loader's cache) or as pip wheels (``nvidia-cuda-nvrtc-cu12``, ``nvidia-cublas-cu12``), which put
them under ``site-packages/nvidia/<part>/lib``. Nothing here loads a library; it only lists the
candidates in order, so a caller can say everywhere it looked.
"""
import ctypes.util
import glob
import importlib.util
import os

TOOLKIT_ROOTS = ("CUDA_HOME", "CUDA_PATH")


def wheel_lib_dirs(part):
    """lib folders of NVIDIA's wheel for ``part`` (``cuda_nvrtc``, ``cublas``), if installed."""
    try:
        spec = importlib.util.find_spec("nvidia." + part)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    return [os.path.join(p, "lib") for p in (spec.submodule_search_locations or [])
            if os.path.isdir(os.path.join(p, "lib"))]


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


def _versioned(folder, stem, major=None):
    """libSTEM.so.MAJOR (or any libSTEM.so*) in ``folder``, newest name last."""
    pattern = "lib%s.so.%s*" % (stem, major) if major else "lib%s.so*" % stem
    # the "alt" builds of the wheels are a second copy for static-linking users; skip them
    return sorted(p for p in glob.glob(os.path.join(folder, pattern)) if ".alt." not in p)


def candidates(stem, wheel_part, env_var, major=None, wheel_first=True):
    """Paths to try for lib``stem``, in order: ``env_var``, the wheel, the toolkit, the loader.

    ``major`` pins the wheel's and toolkit's soname (NVRTC 12 for sm_70); the loader's name
    (ctypes.util.find_library) is tried last, as it may be any version.
    """
    found = []
    if os.environ.get(env_var):
        found.append(os.environ[env_var])
    wheel = [p for d in wheel_lib_dirs(wheel_part) for p in _versioned(d, stem, major)]
    toolkit = [p for d in toolkit_lib_dirs() for p in _versioned(d, stem, major)]
    for path in (wheel + toolkit) if wheel_first else (toolkit + wheel):
        if path not in found:
            found.append(path)
    name = ctypes.util.find_library(stem)
    if name and name not in found:
        found.append(name)
    return found


def load(stem, wheel_part, env_var, what, major=None, wheel_first=True):
    """The first candidate that loads, as a ctypes.CDLL; OSError naming every place tried."""
    tried = []
    for path in candidates(stem, wheel_part, env_var, major, wheel_first):
        try:
            return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            tried.append("%s (%s)" % (path, exc))
    where = "; ".join(tried) if tried else "no lib%s found" % stem
    raise OSError("%s is not available: %s. Install it (%s) or set %s to the library's path"
                  % (what, where, {"cuda_nvrtc": "pip install nvidia-cuda-nvrtc-cu12",
                                   "cublas": "pip install nvidia-cublas-cu12"}[wheel_part],
                     env_var))
