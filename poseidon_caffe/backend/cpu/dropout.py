"""Dropout's map on the CPU: the draws of ../dropout_bits.py by the compiled kernel
(kernels/dropout.c, its parts on the library's own threads), or by numpy's reference where the
library is absent."""
import numpy as np

from ..dropout_bits import check_count, kept, threshold
from . import native


def apply(x, y, key, ratio, scale, parts=1):
    """y = x scale where kept, else x times 0 (Caffe keeps a NaN a NaN); y may be x."""
    check_count(x.size)
    if native.lib is None or not native.takes(x, y):
        y[...] = x * kept(key, x.size, ratio).reshape(x.shape) * np.float32(scale)
        return y
    native.dropout_apply(x, y, 0, x.size, key, threshold(ratio), scale, parts)
    return y
