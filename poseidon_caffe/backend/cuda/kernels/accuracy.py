"""The kernels of accuracy.cu, as named objects (written by scripts/kernel_stubs.py from the
source's KERNEL declarations; a test checks they agree)."""
from ..launch import Kernel

# (n, scores, label, channels, inner, top_k, has_ignore_label, ignore_label, hits, counts,
#  class_hits, class_counts)
accuracy_forward = Kernel("accuracy", "accuracy_forward", "iPPiiiiiPPPP")
