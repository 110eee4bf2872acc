"""Layer family: linear maps with learned weights (InnerProduct, Embed)."""
import numpy as np

from ..blob import Blob
from ..fillers import fill
from .base import Layer
from .registry import register


@register("InnerProduct")
class InnerProductLayer(Layer):
    """top = bottom (flattened from ``axis``) x W^T + b; W is (N, K), or (K, N) with transpose."""
    device_ready = True
    exact_bottoms = 1
    exact_tops = 1

    def setup(self, bottom, top):
        p = self.param.inner_product_param
        if not p.HasField("num_output") or p.num_output < 1:
            raise self.error("inner_product_param.num_output must be set to a positive number")
        self.num_output = int(p.num_output)
        self.bias_term = p.bias_term
        self.transpose = p.transpose
        self.axis = self._axis(bottom[0])
        self.k = bottom[0].count_axes(self.axis)
        weight_shape = ((self.k, self.num_output) if self.transpose
                        else (self.num_output, self.k))
        shapes = [weight_shape] + ([(self.num_output,)] if self.bias_term else [])
        if self.blobs:
            self.check_loaded_blobs(shapes)
        else:
            self.blobs = [Blob(weight_shape)]
            fill(self.blobs[0], p.weight_filler)
            if self.bias_term:
                self.blobs.append(Blob((self.num_output,)))
                fill(self.blobs[1], p.bias_filler)
        self.param_propagate_down = [True] * len(self.blobs)

    def _axis(self, blob):
        try:
            return blob.canonical_axis_index(self.param.inner_product_param.axis)
        except ValueError as exc:
            raise self.error(str(exc)) from None

    def reshape(self, bottom, top):
        axis = self._axis(bottom[0])
        k = bottom[0].count_axes(axis)
        if k != self.k:
            raise self.error("input size incompatible with inner product parameters: bottom %s "
                             "gives %d inputs from axis %d, the weights take %d"
                             % (bottom[0].shape, k, axis, self.k))
        self.axis = axis
        self.m = bottom[0].count_axes(0, axis)
        top[0].reshape(bottom[0].shape[:axis] + (self.num_output,))

    def forward(self, bottom, top):
        be = self.backend
        x = bottom[0].dev_data.reshape(self.m, self.k)
        y = top[0].mutable_dev_data.reshape(self.m, self.num_output)
        be.gemm(x, self.blobs[0].dev_data, trans_b=not self.transpose, out=y)
        if self.bias_term:
            be.add_bias(y.reshape(self.m, self.num_output, 1), self.blobs[1].dev_data)

    def sufficient_factors(self, bottom, top):
        """(top diff as (M, N), bottom data as (M, K)): the weight gradient is their product,
        dy^T x (x^T dy with transpose), so it can travel as these two thin matrices."""
        return (top[0].diff.reshape(self.m, self.num_output),
                bottom[0].data.reshape(self.m, self.k))

    def sufficient_factor_source(self, bottom, top):
        """How the weight gradient can travel as sufficient factors, for the sync engine:
        {"inputs": K, "outputs": N, "transpose": the weight layout, "rows_per_pass": M,
        "read": fn() -> ``sufficient_factors(bottom, top)``}; None when the weight blob is not
        this layer's own K x N matrix."""
        if len(bottom) != 1 or self.blobs[0].count != self.k * self.num_output:
            return None
        return {"inputs": self.k, "outputs": self.num_output, "transpose": bool(self.transpose),
                "rows_per_pass": self.m, "read": lambda: self.sufficient_factors(bottom, top)}

    def backward(self, top, propagate_down, bottom):
        be = self.backend
        dy = top[0].dev_diff.reshape(self.m, self.num_output)
        x = bottom[0].dev_data.reshape(self.m, self.k)
        weights = self.blobs[0]
        if self.param_propagate_down[0]:
            if self.transpose:
                be.gemm(x, dy, trans_a=True, beta=1.0, out=weights.mutable_dev_diff)
            else:
                be.gemm(dy, x, trans_a=True, beta=1.0, out=weights.mutable_dev_diff)
        if self.bias_term and self.param_propagate_down[1]:
            be.add_bias_grad(dy.reshape(self.m, self.num_output, 1),
                             self.blobs[1].mutable_dev_diff)
        if propagate_down[0]:
            dx = bottom[0].mutable_dev_diff.reshape(self.m, self.k)
            be.gemm(dy, weights.dev_data, trans_b=self.transpose, out=dx)


@register("Embed")
class EmbedLayer(Layer):
    """A lookup table: each integer index in the bottom selects a row of W (input_dim, N)."""
    device_ready = True            # the indices are checked on the host, the rows copied there
    exact_bottoms = 1
    exact_tops = 1

    def setup(self, bottom, top):
        p = self.param.embed_param
        if not p.HasField("num_output") or p.num_output < 1:
            raise self.error("embed_param.num_output must be set to a positive number")
        if not p.HasField("input_dim") or p.input_dim < 1:
            raise self.error("embed_param.input_dim must be set to a positive number")
        self.num_output = int(p.num_output)
        self.input_dim = int(p.input_dim)
        self.bias_term = p.bias_term
        shapes = [(self.input_dim, self.num_output)] + ([(self.num_output,)]
                                                         if self.bias_term else [])
        if self.blobs:
            self.check_loaded_blobs(shapes)
        else:
            self.blobs = [Blob(shapes[0])]
            fill(self.blobs[0], p.weight_filler)
            if self.bias_term:
                self.blobs.append(Blob(shapes[1]))
                fill(self.blobs[1], p.bias_filler)
        self.param_propagate_down = [True] * len(self.blobs)

    def allow_force_backward(self, bottom_index):
        return False                       # indices have no gradient

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape + (self.num_output,))

    def _indices(self, bottom):
        values = bottom[0].data.reshape(-1)
        index = values.astype(np.int64)
        if not np.array_equal(index, values):
            bad = values[index != values][0]
            raise self.error("bottom holds a non-integer index %g" % bad)
        out_of_range = (index < 0) | (index >= self.input_dim)
        if out_of_range.any():
            raise self.error("index %d out of range: input_dim is %d (indices 0..%d)"
                             % (index[out_of_range][0], self.input_dim, self.input_dim - 1))
        return index

    def forward(self, bottom, top):
        be = self.backend
        self._index = self._indices(bottom)
        y = top[0].mutable_dev_data.reshape(-1, self.num_output)
        be.embed_forward(self._index, bottom[0].dev_data.reshape(-1), self.blobs[0].dev_data,
                         y)
        if self.bias_term:
            be.add_bias(y.reshape(y.shape[0], self.num_output, 1), self.blobs[1].dev_data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise self.error("cannot backpropagate to the indices (bottom 0)")
        be = self.backend
        dy = top[0].dev_diff.reshape(-1, self.num_output)
        if self.param_propagate_down[0]:
            be.embed_backward(self._indices(bottom), bottom[0].dev_data.reshape(-1), dy,
                              self.blobs[0].mutable_dev_diff)
        if self.bias_term and self.param_propagate_down[1]:
            be.add_bias_grad(dy.reshape(dy.shape[0], self.num_output, 1),
                             self.blobs[1].mutable_dev_diff)
