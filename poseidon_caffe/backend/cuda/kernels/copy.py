"""The kernels of copy.cu, as named objects (written by scripts/kernel_stubs.py from the
source's KERNEL declarations; a test checks they agree)."""
from ..launch import Kernel

# (n, in, to_whole, inner, whole_axis, part_axis, offset, out)
concat = Kernel("copy", "concat", "iPiiiiiP")
# (n, num_axes, geometry, from, to, forward)
crop_copy = Kernel("copy", "crop_copy", "iiPPPi")
# (n, bottom, inner, tiles, top)
tile_forward = Kernel("copy", "tile_forward", "iPiiP")
# (n, top_diff, inner, tiles, bottom_diff)
tile_backward = Kernel("copy", "tile_backward", "iPiiP")
# (n, from, a, b, inner, bias, to)
swap_outer_axes = Kernel("copy", "swap_outer_axes", "iPiiiPP")
