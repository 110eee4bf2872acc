"""Which driver opens a GPU, and why none can: the one place that reads the driver settings.

``POSEIDON_CAFFE_DRIVER`` chooses: ``cuda-bindings`` (NVIDIA's ``cuda-bindings`` wheel, the
default), ``pycuda``, ``emulated`` (the test device of drivers/emulated.py), or
``auto``/unset: pycuda when it is importable (a user who installed ``.[pycuda]`` asked for
it), else cuda-bindings.
The older ``POSEIDON_CAFFE_GPU=emulated`` still selects the emulated device.

A real driver first checks that the machine has NVIDIA's driver library at all, so a machine
without a GPU is told so in one line (train on the CPU, or try the emulated device) rather
than asked to install a Python package that would not help.
"""
import ctypes
import importlib
import importlib.util
import os

DRIVER_ENV = "POSEIDON_CAFFE_DRIVER"
LEGACY_ENV = "POSEIDON_CAFFE_GPU"          # "emulated" (older name of the same choice)
REAL = ("cuda-bindings", "pycuda")
KINDS = REAL + ("emulated",)
ALIASES = {"": "auto", "auto": "auto", "cuda": "auto", "real": "auto",
           "cuda-bindings": "cuda-bindings", "cuda_bindings": "cuda-bindings",
           "bindings": "cuda-bindings", "pycuda": "pycuda", "emulated": "emulated"}
# a driver is found by its name: drivers/<name, "-" as "_">.py, whose DRIVER is its class; the
# interface (driver.py) and this module import none of them
DRIVERS_PACKAGE = __package__ + ".drivers"
LIBCUDA = "libcuda.so.1"
HOW_ELSE = ("train on the CPU (leave out -gpu, or solver_mode: CPU), or try the emulated "
            "test device with %s=emulated" % DRIVER_ENV)


class ChoiceError(ValueError):
    """A driver setting that names no driver (one line)."""


def _setting(var):
    value = os.environ.get(var, "").strip().lower()
    if value not in ALIASES:
        raise ChoiceError("%s=%r: expected one of auto, %s" % (var, value, ", ".join(KINDS)))
    return ALIASES[value]


def requested():
    """The driver the environment asks for: "auto", or one of KINDS."""
    asked = _setting(DRIVER_ENV)
    if asked == "auto" and _setting(LEGACY_ENV) == "emulated":
        return "emulated"
    return asked


def resolve(kind):
    """The concrete driver of ``kind`` ("auto"/"cuda": pycuda when importable, else
    cuda-bindings)."""
    kind = ALIASES.get(str(kind).strip().lower(), kind)
    if kind == "auto":
        return "pycuda" if importlib.util.find_spec("pycuda") is not None else "cuda-bindings"
    if kind not in KINDS:
        raise ChoiceError("unknown driver %r (expected one of auto, %s)"
                          % (kind, ", ".join(KINDS)))
    return kind


def driver_kind():
    """The concrete driver that set_mode_gpu() opens in this environment."""
    return resolve(requested())


def nvidia_driver_missing():
    """None when NVIDIA's driver library loads; else the one line that says there is no GPU
    here and what to do instead."""
    try:
        ctypes.CDLL(LIBCUDA)
    except OSError:
        return "no GPU here: no NVIDIA driver found (%s does not load); %s" % (LIBCUDA, HOW_ELSE)
    return None


def require_nvidia_driver():
    """Raise the driver interface's DriverError with nvidia_driver_missing()'s line, if any
    (what a real driver checks before it imports its binding)."""
    missing = nvidia_driver_missing()
    if missing:
        from .driver import DriverError
        raise DriverError(missing)


def no_device(driver_version):
    """The line for a driver that sees no device."""
    return "no GPU here: the NVIDIA driver (CUDA %s) sees no device; %s" % (
        version_text(driver_version), HOW_ELSE)


def version_text(version):
    """CUDA's integer version (13000) as "13.0"."""
    return "%d.%d" % (version // 1000, version % 1000 // 10)


def driver_class(kind):
    """The Driver class of ``kind``: "cuda-bindings", "pycuda", "emulated", or "cuda"/"auto"
    (``resolve``: pycuda when importable, else cuda-bindings)."""
    try:
        kind = resolve(kind)
    except ChoiceError as exc:
        from .driver import DriverError
        raise DriverError(str(exc)) from None
    return importlib.import_module("%s.%s" % (DRIVERS_PACKAGE, kind.replace("-", "_"))).DRIVER


def open_driver(kind, device=0):
    """A Driver of ``kind`` (see driver_class) on ``device``."""
    return driver_class(kind)(device)


def device_count(kind):
    """How many devices the driver of ``kind`` sees; DriverError (one line) when it cannot
    start: no NVIDIA driver, no binding."""
    return driver_class(kind).device_count()
