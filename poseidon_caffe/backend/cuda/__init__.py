"""The CUDA backend: a device behind a narrow driver interface, the kernels, BLAS, the op set.

- ``backend.py``: ``CUDABackend``, the op set of backend/ops.py over a driver (device arrays,
  named light ops, gemm through cuBLAS, LRN), with the plans of ``conv.py`` (convolution,
  im2col) and ``pool.py``; the op families in the CPU backend's module names (``common_ops``,
  ``loss_ops``, ``mvn_ops``, ``prelu_ops``, ``recurrent_ops``);
- ``driver.py``: the interface (memory, copies, streams, events, modules, launches, BLAS);
  ``choice.py``: which driver the environment asks for, why there is no GPU, and
  ``open_driver("cuda-bindings" | "pycuda" | "emulated" | "cuda", device)``, which finds the
  driver's module by name (the interface imports none of them);
- ``drivers/``, one module per driver, found by its name: ``cuda_bindings.py`` (a GPU through
  NVIDIA's cuda-bindings) and ``pycuda.py`` (through pycuda), over what ``real_driver.py``
  gives both (cuBLAS through ``cublas.py``, kernel images chosen by ``images.py``, libraries
  found by ``libraries.py``); and ``emulated.py`` (host memory, the kernels built for the
  host, numpy BLAS in ``emulated_blas.py``);
- ``kernels/``: the op set's kernels, ``<module>.cu``, one source for NVRTC and the host
  compiler (``build.py`` compiles and caches), and beside each ``<module>.py``, its kernels as
  named objects; ``launch.py`` reads the parameter lists and launches
  (``launcher.run(kernels.neuron.relu_forward, n, ...)``);
- ``synced.py``: Caffe's SyncedMemory over a driver.

Importing this package imports neither pycuda, nor cuda-bindings, nor any NVIDIA library.
"""
from .backend import CUDABackend, DeviceArray, DeviceMemoryError  # noqa: F401
