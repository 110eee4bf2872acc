"""The named ops of common.py's Reduction, ArgMax, Filter and BatchReindex on the
device (kernels/reduce.cu, rows.cu); the CPU backend's are in cpu/common_ops.py
under the same names. Host row indices go up as one small float array."""
import numpy as np

from . import kernels

_REDUCTIONS = {"SUM": 1, "ASUM": 2, "SUMSQ": 3, "MEAN": 4}   # caffe.proto's numbers


class CommonOps:

    def reduction_forward(self, x, op, coeff, y):
        num, dim = x.shape
        self.launcher.run(kernels.reduce.reduction_forward, num, x.ptr, dim, _REDUCTIONS[op],
                          float(coeff), y.ptr)

    def reduction_backward(self, x, dy, op, coeff, dx):
        num, dim = x.shape
        self.launcher.run(kernels.reduce.reduction_backward, x.size, x.ptr, dy.ptr, dim,
                          _REDUCTIONS[op], float(coeff), dx.ptr)

    def argmax(self, x, axis, top_k, out_max_val, y):
        if axis is None:
            outer, dim, inner = x.shape[0], x.size // max(x.shape[0], 1), 1
        else:
            outer = int(np.prod(x.shape[:axis], dtype=np.int64))
            dim = x.shape[axis]
            inner = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
        self.launcher.run(kernels.reduce.argmax_forward, outer * inner, x.ptr, dim, inner,
                          int(top_k), int(out_max_val), int(axis is not None), y.ptr)

    def _row_array(self, rows):
        return self.to_device(np.asarray(rows, dtype=np.float32).reshape(-1))

    def gather_rows(self, x, rows, y):
        if y.size:
            inner = y.size // y.shape[0]
            picks = self._row_array(rows)          # held: its memory is freed with it
            self.launcher.run(kernels.rows.rows_gather, y.size, x.ptr, picks.ptr, inner, y.ptr)

    def scatter_rows(self, dy, rows, dx, unique=False):
        if dx.size:
            inner = dx.size // dx.shape[0]
            picks = self._row_array(rows)
            self.launcher.run(kernels.rows.rows_scatter_add, dx.size, dy.ptr, picks.ptr, len(rows),
                              inner, dx.ptr)
