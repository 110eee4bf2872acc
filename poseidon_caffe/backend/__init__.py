"""The seam between layers and the hardware: a backend carries an op set that layers call.

``cpu`` (numpy) is always available. ``cuda/`` is the CUDA backend (a driver interface over
pycuda or an emulated device, the kernels, cuBLAS); set_mode_gpu() chooses it for the device
of set_device(), the emulated one when POSEIDON_CAFFE_GPU=emulated. Layers never import
numpy-specific or CUDA-specific code for their heavy work; they call the current backend's
ops (see ops.md for the op set).
"""
_state = {"backend": None, "mode": "cpu", "device": 0, "devices": {}}


class GPUUnavailable(RuntimeError):
    """GPU mode cannot start: no pycuda, no CUDA driver, or no such device (one line)."""


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
    from .cuda.backend import CUDABackend, driver_kind
    from .cuda.driver import DriverError
    device = _state["device"] if device is None else int(device)
    try:
        key = (driver_kind(), device)
        backend = _state["devices"].get(key)
        if backend is None:
            backend = _state["devices"][key] = CUDABackend(device, key[0])
    except DriverError as exc:
        raise GPUUnavailable(str(exc)) from None
    return backend


def gpu_count():
    """How many devices the driver of POSEIDON_CAFFE_GPU (default: CUDA) sees; 0 without one;
    GPUUnavailable when the driver or pycuda is missing."""
    from .cuda.backend import driver_kind
    from .cuda.driver import DriverError, device_count
    try:
        kind = driver_kind()
        if kind == "cuda":
            from .cuda.pycuda_driver import _pycuda
            _pycuda()                  # one line when pycuda or the driver is missing
        return device_count(kind)
    except DriverError as exc:
        raise GPUUnavailable(str(exc)) from None


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
