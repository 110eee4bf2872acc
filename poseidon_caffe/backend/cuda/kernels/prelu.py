"""The kernels of prelu.cu, as named objects (written by scripts/kernel_stubs.py from the
source's KERNEL declarations; a test checks they agree)."""
from ..launch import Kernel

# (n, x, y, slopes, channels, inner)
prelu_forward = Kernel("prelu", "prelu_forward", "iPPPii")
# (n, dy, x, dx, slopes, channels, inner)
prelu_backward = Kernel("prelu", "prelu_backward", "iPPPPii")
# (n, dy, x, terms)
prelu_slope_terms = Kernel("prelu", "prelu_slope_terms", "iPPP")
