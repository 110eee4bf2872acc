"""The drivers, one module each, named after the driver (``cuda_bindings``, ``pycuda``,
``emulated``): ``choice.driver_class`` imports the one asked for by that name and takes its
``DRIVER``. Nothing imports this package's modules otherwise, so a machine without pycuda or
cuda-bindings imports the backend."""
