"""The kernels of embed.cu, as named objects (written by scripts/kernel_stubs.py from the
source's KERNEL declarations; a test checks they agree)."""
from ..launch import Kernel

# (n, indices, weight, input_dim, num_output, bias, top)
embed_forward = Kernel("embed", "embed_forward", "iPPiiPP")
# (n, indices, top_diff, count, num_output, weight_diff)
embed_backward = Kernel("embed", "embed_backward", "iPPiiP")
