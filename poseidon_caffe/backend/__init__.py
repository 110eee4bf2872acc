"""The seam between layers and the hardware: a backend carries the op set of ops.py, which
layers, the solver and the sync engine call.

``cpu/`` (numpy) is always available. ``cuda/`` is the CUDA backend (a driver interface over
NVIDIA's cuda-bindings, pycuda or an emulated device, the kernels, cuBLAS); set_mode_gpu()
chooses it for the device of set_device(), through the driver POSEIDON_CAFFE_DRIVER names
(cuda/choice.py; "emulated" is the test device). Layers never import numpy-specific or
CUDA-specific code for their heavy work; they call the current backend's ops (README.md).
This module imports either backend only when a mode asks for it.
"""
_state = {"backend": None, "mode": "cpu", "device": 0, "devices": {}}


class GPUUnavailable(RuntimeError):
    """GPU mode cannot start: no GPU, no driver binding, or no such device (one line)."""


def get_backend():
    if _state["backend"] is None:
        from .cpu import CPUBackend
        _state["backend"] = CPUBackend()
    return _state["backend"]


def set_mode_cpu():
    from .cpu import CPUBackend
    _state["mode"] = "cpu"
    _state["backend"] = CPUBackend()


def gpu_backend(device=None):
    """The CUDA backend of ``device`` (default: set_device's), opened once per process and
    driver kind; GPUUnavailable says why it cannot be."""
    from .cuda.backend import CUDABackend
    from .cuda.choice import ChoiceError, driver_kind
    from .cuda.driver import DriverError
    device = _state["device"] if device is None else int(device)
    try:
        key = (driver_kind(), device)
        backend = _state["devices"].get(key)
        if backend is None:
            backend = _state["devices"][key] = CUDABackend(device, key[0])
    except (DriverError, ChoiceError) as exc:
        raise GPUUnavailable(str(exc)) from None
    return backend


def gpu_count():
    """How many devices the chosen driver (POSEIDON_CAFFE_DRIVER) sees; GPUUnavailable, one
    line, when it cannot start (no NVIDIA driver, no binding) or sees none."""
    from .cuda.choice import ChoiceError, driver_kind
    from .cuda.choice import device_count
    from .cuda.driver import DriverError
    try:
        return device_count(driver_kind())
    except (DriverError, ChoiceError) as exc:
        raise GPUUnavailable(str(exc)) from None


def is_device_error(exc):
    """Whether ``exc`` is a device's failure: the driver's error, or pycuda's or
    cuda-bindings' own (a launch that faulted shows at the next call to the device)."""
    from .cuda.driver import DriverError
    return (isinstance(exc, DriverError)
            or type(exc).__module__.split(".")[0] in ("pycuda", "cuda"))


def set_mode_gpu():
    backend = gpu_backend()
    _state["mode"] = "gpu"
    _state["backend"] = backend


def set_device(device_id):
    """The GPU that GPU mode uses; in GPU mode already (pycaffe's set_mode_gpu(); set_device(1))
    the backend moves to it at once."""
    device = int(device_id)
    if _state["mode"] == "gpu":
        _state["backend"] = gpu_backend(device)
    _state["device"] = device


def mode():
    return _state["mode"]
