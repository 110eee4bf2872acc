"""Stand-in CUDA driver libraries for running the project's real drivers without a GPU.

NVIDIA's cuda-bindings and pycuda (built from its sdist, pycuda_build.py) load the stand-in
libcuda.so.1 as they would a driver, and the backend's cuBLAS binding the stand-in
libcublas.so.13: their own code paths run in CI, over host memory, with the host build of
the kernels. ``prepare()`` builds them (cached) and gives the environment a subprocess needs;
it raises StandInUnavailable, for a pytest skip, when the machine lacks a tool they need.
"""
from .build import StandIn, cache_root, prepare
from .errors import StandInUnavailable

__all__ = ["StandIn", "StandInUnavailable", "cache_root", "prepare"]
