"""The kernels of eltwise.cu, as named objects (written by scripts/kernel_stubs.py from the
source's KERNEL declarations; a test checks they agree)."""
from ..launch import Kernel

# (n, a, b, blob, top, mask)
eltwise_max_forward = Kernel("eltwise", "eltwise_max_forward", "iPPiPP")
# (n, top_diff, mask, blob, bottom_diff)
eltwise_max_backward = Kernel("eltwise", "eltwise_max_backward", "iPPiP")
