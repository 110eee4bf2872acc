"""The kernels of loss.cu, as named objects (written by scripts/kernel_stubs.py from the
source's KERNEL declarations; a test checks they agree)."""
from ..launch import Kernel

# (n, x, labels, dim, margin)
hinge_forward = Kernel("loss", "hinge_forward", "iPPiP")
# (n, margin, labels, dim, l2, scale, dx)
hinge_backward = Kernel("loss", "hinge_backward", "iPPiifP")
# (n, a, b, similar, dim, margin, legacy, dist_sq, loss)
contrastive_forward = Kernel("loss", "contrastive_forward", "iPPPifiPP")
# (n, a, b, similar, dist_sq, dim, margin, legacy, alpha, dx)
contrastive_backward = Kernel("loss", "contrastive_backward", "iPPPPififP")
# (n, prob, labels, h, channels, inner, has_ignore_label, ignore_label, loss, counts)
infogain_forward = Kernel("loss", "infogain_forward", "iPPPiiiiPP")
# (n, prob, labels, h, channels, inner, has_ignore_label, ignore_label, scale, dx)
infogain_backward = Kernel("loss", "infogain_backward", "iPPPiiiifP")
# (n, prob, labels, dim, loss)
multinomial_logistic_forward = Kernel("loss", "multinomial_logistic_forward", "iPPiP")
# (n, prob, labels, dim, scale, dx)
multinomial_logistic_backward = Kernel("loss", "multinomial_logistic_backward", "iPPifP")
# (n, x, target, has_ignore_label, ignore_label, loss, counts)
sigmoid_cross_entropy_forward = Kernel("loss", "sigmoid_cross_entropy_forward", "iPPiiPP")
# (n, x, target, has_ignore_label, ignore_label, scale, dx)
sigmoid_cross_entropy_backward = Kernel("loss", "sigmoid_cross_entropy_backward", "iPPiifP")
