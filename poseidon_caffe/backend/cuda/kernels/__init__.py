"""The kernel sources (``<module>.cu``, one source for NVRTC and the host compiler; build.py
compiles them) and, beside each, ``<module>.py``: its kernels as named ``Kernel`` objects
(launch.py), which ``launcher.run`` launches."""
from . import (accuracy, batchnorm, copy, eltwise, embed, im2col, loss, lrn, math, mvn, neuron,
               pooling, prelu, recurrent, reduce, rows, softmax, updates)  # noqa: F401
