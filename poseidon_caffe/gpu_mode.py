"""GPU mode as the commands and pycaffe enter it: the backend's set_mode_gpu(), and one log
line per process when the device is the emulated one, so nobody takes its times for a GPU's."""
from . import backend, log

_noted = []


def set_mode_gpu():
    backend.set_mode_gpu()
    device = backend.get_backend()
    if device.emulated and not _noted:
        _noted.append(True)
        log.warning("GPU mode runs on the emulated device: a test device that runs the "
                    "kernels on the host, many times slower than the CPU backend")
