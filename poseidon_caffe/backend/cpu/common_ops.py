"""The named ops of common.py's Reduction, ArgMax, Filter and BatchReindex on the CPU:
numpy over whole arrays, the formulas the layers had inline (so results are unchanged). The
CUDA backend has the same names over kernels/reduce.cu and rows.cu (cuda/common_ops.py).
Row indices are host integer arrays: the layers read them to check them (BatchReindex) or to
shape the top (Filter), as Caffe does."""
import numpy as np


class CommonOps:

    def reduction_forward(self, x, op, coeff, y):
        """y (num) = op ("SUM", "ASUM", "SUMSQ", "MEAN") over each row of x (num, dim),
        times coeff."""
        if op == "SUM":
            out = x.sum(axis=1)
        elif op == "ASUM":
            out = np.abs(x).sum(axis=1)
        elif op == "SUMSQ":
            out = (x * x).sum(axis=1)
        else:
            out = x.sum(axis=1) / x.shape[1]
        y[...] = (out * coeff).reshape(y.shape)

    def reduction_backward(self, x, dy, op, coeff, dx):
        scale = (dy.reshape(x.shape[0], 1) * coeff)
        if op == "SUM":
            grad = np.broadcast_to(scale, x.shape)
        elif op == "ASUM":
            grad = np.sign(x) * scale
        elif op == "SUMSQ":
            grad = 2.0 * x * scale
        else:
            grad = np.broadcast_to(scale / x.shape[1], x.shape)
        dx[...] = grad.reshape(dx.shape)

    def argmax(self, x, axis, top_k, out_max_val, y):
        """Indices (or with out_max_val values, or both without an axis) of the top_k largest
        entries along ``axis``, or of each item flattened when ``axis`` is None; ties rank
        the larger index first."""
        rows = np.moveaxis(x, axis, -1) if axis is not None else x.reshape(x.shape[0], -1)
        dim = rows.shape[-1]
        # sort by value descending, ties by index descending: stable sort of the reversed row
        order = np.argsort(-rows[..., ::-1], axis=-1, kind="stable")[..., :top_k]
        idx = dim - 1 - order
        if axis is not None:
            out = np.take_along_axis(rows, idx, axis=-1) if out_max_val else idx
            y[...] = np.moveaxis(out, -1, axis)
        elif out_max_val:
            vals = np.take_along_axis(rows, idx, axis=-1)
            y[...] = np.stack([idx, vals], axis=1).reshape(y.shape)
        else:
            y[...] = idx.reshape(y.shape)

    def gather_rows(self, x, rows, y):
        """y = x[rows] along axis 0."""
        y[...] = x[rows]

    def scatter_rows(self, dy, rows, dx, unique=False):
        """dx = 0, then dy's row t added into dx's row rows[t] (``unique``: no row twice)."""
        dx[...] = 0
        if unique:
            dx[rows] = dy
        else:
            np.add.at(dx, rows, dy)
