"""The kernels of updates.cu, as named objects (written by scripts/kernel_stubs.py from the
source's KERNEL declarations; a test checks they agree)."""
from ..launch import Kernel

# (n, g, h, momentum, local_rate)
sgd_update = Kernel("updates", "sgd_update", "iPPff")
# (n, g, h, momentum, local_rate)
nesterov_update = Kernel("updates", "nesterov_update", "iPPff")
# (n, g, h, delta, local_rate)
adagrad_update = Kernel("updates", "adagrad_update", "iPPff")
# (n, g, h, rms_decay, delta, local_rate)
rmsprop_update = Kernel("updates", "rmsprop_update", "iPPfff")
# (n, g, h, h2, momentum, delta, local_rate)
adadelta_update = Kernel("updates", "adadelta_update", "iPPPfff")
# (n, g, m, v, beta1, beta2, eps_hat, corrected_rate)
adam_update = Kernel("updates", "adam_update", "iPPPffff")
