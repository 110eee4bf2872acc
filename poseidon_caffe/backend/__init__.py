"""The seam between layers and the hardware: a backend carries an op set that layers call.

``cpu`` (numpy) is always available. ``cuda/`` holds the CUDA backend's foundation (a driver
interface over pycuda or an emulated device, the kernels, cuBLAS); set_mode_gpu() will choose
it once the layers run there, and until then says that there is no GPU backend. Layers never
import numpy-specific or CUDA-specific code for their heavy work; they call the current
backend's ops (see cpu.py for the op set).
"""
_state = {"backend": None, "mode": "cpu", "device": 0}


def get_backend():
    if _state["backend"] is None:
        from .cpu import CPUBackend
        _state["backend"] = CPUBackend()
    return _state["backend"]


def set_mode_cpu():
    from .cpu import CPUBackend
    _state["mode"] = "cpu"
    _state["backend"] = CPUBackend()


def set_mode_gpu():
    try:
        from .cuda import CUDABackend
    except ImportError as exc:
        if exc.name == __name__ + ".cuda":
            # the cuda package holds the device's foundation (driver, kernels, BLAS) but no
            # backend for the layers yet: installing pycuda cannot help
            raise RuntimeError("this installation has no GPU backend (it runs on the CPU)") from None
        raise RuntimeError("GPU mode needs the 'gpu' extra (pycuda) and a CUDA driver: %s" % exc)
    _state["mode"] = "gpu"
    _state["backend"] = CUDABackend(_state["device"])


def set_device(device_id):
    _state["device"] = int(device_id)


def mode():
    return _state["mode"]
