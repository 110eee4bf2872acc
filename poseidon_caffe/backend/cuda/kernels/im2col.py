"""The kernels of im2col.cu, as named objects (written by scripts/kernel_stubs.py from the
source's KERNEL declarations; a test checks they agree)."""
from ..launch import Kernel

# (n, data_im, height, width, kernel_h, kernel_w, pad_h, pad_w, stride_h, stride_w, dilation_h,
#  dilation_w, height_col, width_col, data_col)
im2col_2d = Kernel("im2col", "im2col_2d", "iPiiiiiiiiiiiiP")
# (n, data_col, height, width, kernel_h, kernel_w, pad_h, pad_w, stride_h, stride_w, dilation_h,
#  dilation_w, height_col, width_col, data_im)
col2im_2d = Kernel("im2col", "col2im_2d", "iPiiiiiiiiiiiiP")
# (n, data_im, num_axes, geometry, data_col)
im2col_nd = Kernel("im2col", "im2col_nd", "iPiPP")
# (n, data_col, num_axes, geometry, data_im)
col2im_nd = Kernel("im2col", "col2im_nd", "iPiPP")
