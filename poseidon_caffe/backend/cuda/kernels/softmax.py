"""The kernels of softmax.cu, as named objects (written by scripts/kernel_stubs.py from the
source's KERNEL declarations; a test checks they agree)."""
from ..launch import Kernel

# (n, data, channels, inner, out)
channel_max = Kernel("softmax", "channel_max", "iPiiP")
# (n, channels, inner, per_position, data)
channel_subtract = Kernel("softmax", "channel_subtract", "iiiPP")
# (n, data, channels, inner, out)
channel_sum = Kernel("softmax", "channel_sum", "iPiiP")
# (n, channels, inner, per_position, data)
channel_div = Kernel("softmax", "channel_div", "iiiPP")
# (n, a, b, channels, inner, out)
channel_dot = Kernel("softmax", "channel_dot", "iPPiiP")
# (n, prob, label, channels, inner, has_ignore_label, ignore_label, loss, counts)
softmax_loss_forward = Kernel("softmax", "softmax_loss_forward", "iPPiiiiPP")
# (n, label, channels, inner, has_ignore_label, ignore_label, diff, counts)
softmax_loss_backward = Kernel("softmax", "softmax_loss_backward", "iPiiiiPP")
