"""The CUDA backend's foundation: a device behind a narrow driver interface, the kernels, BLAS.

- ``driver.py``: the interface (memory, copies, streams, events, modules, launches, BLAS) and
  ``open_driver("cuda" | "emulated", device)``;
- ``pycuda_driver.py`` (a GPU through pycuda, cuBLAS through ``cublas.py``) and ``emulated.py``
  (host memory, the kernels built for the host, numpy BLAS in ``emulated_blas.py``);
- ``kernels/*.cu``: the op set's kernels, one source for NVRTC and the host compiler
  (``build.py`` compiles and caches; ``kernels.py`` reads their parameter lists and launches);
- ``synced.py``: Caffe's SyncedMemory over a driver.

Layers do not run on the device yet: set_mode_gpu() still refuses (README.md in this folder
says what remains). Importing this package imports neither pycuda nor any NVIDIA library.
"""
