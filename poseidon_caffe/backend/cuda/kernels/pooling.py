"""The kernels of pooling.cu, as named objects (written by scripts/kernel_stubs.py from the
source's KERNEL declarations; a test checks they agree)."""
from ..launch import Kernel

# (n, bottom, height, width, pooled_h, pooled_w, kernel_h, kernel_w, stride_h, stride_w, pad_h,
#  pad_w, top, mask, top_mask)
max_pool_forward = Kernel("pooling", "max_pool_forward", "iPiiiiiiiiiiPPP")
# (n, top_diff, mask, height, width, pooled_h, pooled_w, kernel_h, kernel_w, stride_h, stride_w,
#  pad_h, pad_w, bottom_diff)
max_pool_backward = Kernel("pooling", "max_pool_backward", "iPPiiiiiiiiiiP")
# (n, bottom, height, width, pooled_h, pooled_w, kernel_h, kernel_w, stride_h, stride_w, pad_h,
#  pad_w, top)
ave_pool_forward = Kernel("pooling", "ave_pool_forward", "iPiiiiiiiiiiP")
# (n, top_diff, height, width, pooled_h, pooled_w, kernel_h, kernel_w, stride_h, stride_w,
#  pad_h, pad_w, bottom_diff)
ave_pool_backward = Kernel("pooling", "ave_pool_backward", "iPiiiiiiiiiiP")
# (n, bottom, height, width, pooled_h, pooled_w, kernel_h, kernel_w, stride_h, stride_w,
#  uniform, top, mask)
sto_pool_forward_train = Kernel("pooling", "sto_pool_forward_train", "iPiiiiiiiiPPP")
# (n, bottom, height, width, pooled_h, pooled_w, kernel_h, kernel_w, stride_h, stride_w, top,
#  num, den)
sto_pool_forward_test = Kernel("pooling", "sto_pool_forward_test", "iPiiiiiiiiPPP")
# (n, bottom, top_diff, num, den, height, width, pooled_h, pooled_w, kernel_h, kernel_w,
#  stride_h, stride_w, bottom_diff)
sto_pool_backward_test = Kernel("pooling", "sto_pool_backward_test", "iPPPPiiiiiiiiP")
