"""The kernels of im2col.cu, as named objects (written by scripts/kernel_stubs.py from the
source's KERNEL declarations; a test checks they agree)."""
from ..launch import Kernel

# (n, data_im, channels, height, width, kernel_h, kernel_w, pad_h, pad_w, stride_h, stride_w,
#  dilation_h, dilation_w, height_col, width_col, row_pitch, image_pitch, data_col)
im2col_2d = Kernel("im2col", "im2col_2d", "iPiiiiiiiiiiiiiiiP")
# (n, data_col, channels, height, width, kernel_h, kernel_w, pad_h, pad_w, stride_h, stride_w,
#  dilation_h, dilation_w, height_col, width_col, row_pitch, image_pitch, data_im)
col2im_2d = Kernel("im2col", "col2im_2d", "iPiiiiiiiiiiiiiiiP")
# (n, data_im, channels, num_axes, geometry, row_pitch, image_pitch, data_col)
im2col_nd = Kernel("im2col", "im2col_nd", "iPiiPiiP")
# (n, data_col, channels, num_axes, geometry, row_pitch, image_pitch, data_im)
col2im_nd = Kernel("im2col", "col2im_nd", "iPiiPiiP")
