"""Dropout's map on the CPU: the draws of ../dropout_bits.py by the compiled kernel
(kernels/dropout.c) over threads, or by numpy's reference where the library is absent."""
import numpy as np

from ..dropout_bits import check_count, kept, threshold
from . import native
from .threads import over_parts

# values from which the compiled map runs over threads (the hand-off costs as much as hashing
# a quarter million values: even at 2^18, 1.6x faster at 2^20)
SPLIT = 1 << 19


def apply(x, y, key, ratio, scale, threads=1):
    """y = x scale where kept, else x times 0 (Caffe keeps a NaN a NaN); y may be x."""
    check_count(x.size)
    if native.lib is None or not native.takes(x, y):
        y[...] = x * kept(key, x.size, ratio).reshape(x.shape) * np.float32(scale)
        return y
    t = threshold(ratio)

    def run(i, lo, hi):
        native.dropout_apply(x, y, lo, hi - lo, key, t, scale)
    if threads > 1 and x.size >= SPLIT:
        over_parts(run, x.size, threads)
    else:
        run(0, 0, x.size)
    return y
