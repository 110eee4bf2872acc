"""The CPU backend: the op set of backend/ops.py over numpy (float32, every op over the whole
batch), with convolution plans chosen by a cost model, batch parts over threads, and optional
compiled kernels for pooling and LRN (kernels/*.c). See README.md here for how each family
runs."""
from .backend import CPUBackend  # noqa: F401
