"""The kernels of batchnorm.cu, as named objects (written by scripts/kernel_stubs.py from the
source's KERNEL declarations; a test checks they agree)."""
from ..launch import Kernel

# (n, a, b, num, spatial, mean)
channel_mean = Kernel("batchnorm", "channel_mean", "iPPiiP")
# (n, x, mean, num, spatial, eps, var, std)
channel_variance = Kernel("batchnorm", "channel_variance", "iPPiifPP")
# (n, x, mean, std, channels, spatial, y)
batchnorm_normalize = Kernel("batchnorm", "batchnorm_normalize", "iPPPiiP")
# (n, dy, y, mean_dy, mean_dy_y, std, channels, spatial, global_stats, dx)
batchnorm_backward = Kernel("batchnorm", "batchnorm_backward", "iPPPPPiiiP")
