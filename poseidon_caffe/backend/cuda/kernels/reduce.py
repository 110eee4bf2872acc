"""The kernels of reduce.cu, as named objects (written by scripts/kernel_stubs.py from the
source's KERNEL declarations; a test checks they agree)."""
from ..launch import Kernel

# (n, x, dim, op, coeff, y)
reduction_forward = Kernel("reduce", "reduction_forward", "iPiifP")
# (n, x, dy, dim, op, coeff, dx)
reduction_backward = Kernel("reduce", "reduction_backward", "iPPiifP")
# (n, x, dim, inner, top_k, out_max_val, has_axis, y)
argmax_forward = Kernel("reduce", "argmax_forward", "iPiiiiiP")
