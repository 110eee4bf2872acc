"""The kernels of lrn.cu, as named objects (written by scripts/kernel_stubs.py from the
source's KERNEL declarations; a test checks they agree)."""
from ..launch import Kernel

# (n, x, channels, height, width, size, coef, k, scale)
lrn_scale_across = Kernel("lrn", "lrn_scale_across", "iPiiiiffP")
# (n, x, height, width, size, coef, scale)
lrn_scale_within = Kernel("lrn", "lrn_scale_within", "iPiiifP")
# (n, x, scale, beta, top)
lrn_output = Kernel("lrn", "lrn_output", "iPPfP")
# (n, x, top, scale, dy, channels, height, width, size, beta, coef, dx)
lrn_diff_across = Kernel("lrn", "lrn_diff_across", "iPPPPiiiiffP")
# (n, x, top, scale, dy, height, width, size, beta, coef, dx)
lrn_diff_within = Kernel("lrn", "lrn_diff_within", "iPPPPiiiffP")
