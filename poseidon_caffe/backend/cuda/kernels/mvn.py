"""The kernels of mvn.cu, as named objects (written by scripts/kernel_stubs.py from the
source's KERNEL declarations; a test checks they agree)."""
from ..launch import Kernel

# (n, x, dim, normalize_variance, eps, mean, std)
mvn_row_stats = Kernel("mvn", "mvn_row_stats", "iPiifPP")
# (n, x, mean, std, dim, y)
mvn_normalize = Kernel("mvn", "mvn_normalize", "iPPPiP")
# (n, dy, y, dim, mean_dy, mean_dy_y)
mvn_row_grads = Kernel("mvn", "mvn_row_grads", "iPPiPP")
# (n, dy, y, mean_dy, mean_dy_y, std, dim, dx)
mvn_backward = Kernel("mvn", "mvn_backward", "iPPPPPiP")
