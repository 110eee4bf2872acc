"""Layer family: neuron (elementwise) layers, Caffe's NeuronLayer subclasses.

All may run in place (top is bottom). Layers whose gradient is a function of the output (ReLU,
ELU, Sigmoid, TanH, Exp, Swish, Dropout) read the top data in backward, as Caffe does; layers whose
gradient needs the input keep a copy of it when running in place, so that their gradient stays
right where Caffe's would read the overwritten values.
"""
import numpy as np

from ..blob import Blob
from ..fillers import constant_filler, fill
from ..rng import get_rng
from .base import TRAIN, NeuronLayer
from .registry import register


class _InputKeepingLayer(NeuronLayer):
    """A neuron layer whose backward needs the bottom data even when it runs in place."""

    def _remember_input(self, bottom, top):
        self._input_copy = bottom[0].data.copy() if top[0] is bottom[0] else None

    def _input(self, bottom):
        return self._input_copy if self._input_copy is not None else bottom[0].data


@register("ReLU")
class ReLULayer(NeuronLayer):
    def setup(self, bottom, top):
        self.slope = self.param.relu_param.negative_slope

    def forward(self, bottom, top):
        x = bottom[0].data
        if self.slope:
            top[0].data[...] = np.maximum(x, 0) + self.slope * np.minimum(x, 0)
        else:
            np.maximum(x, 0, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        # in place this reads the output, whose sign is the input's for a non-negative slope
        x = bottom[0].data
        dy = top[0].diff
        positive = x > 0
        if self.slope:
            bottom[0].diff[...] = dy * np.where(positive, 1.0, self.slope).astype(dy.dtype)
        else:
            np.multiply(dy, positive, out=bottom[0].diff)     # no temporary, one pass


@register("PReLU")
class PReLULayer(_InputKeepingLayer):
    """ReLU with a learned negative slope per channel (axis 1), or one shared slope."""

    def setup(self, bottom, top):
        p = self.param.prelu_param
        if bottom[0].num_axes < 2:
            raise self.error("bottom must have at least 2 axes, got shape %s" % (bottom[0].shape,))
        self.shared = p.channel_shared
        channels = bottom[0].shape[1]
        shape = () if self.shared else (channels,)
        if self.blobs:
            if len(self.blobs) != 1 or self.blobs[0].count != (1 if self.shared else channels):
                raise self.error("the model's slopes (%s) do not match %s for %d channels"
                                 % ([b.shape for b in self.blobs],
                                    "one shared slope" if self.shared else "one slope each",
                                    channels))
            self.blobs[0].reshape(shape)
        else:
            self.blobs = [Blob(shape)]
            fill(self.blobs[0], p.filler if p.HasField("filler") else constant_filler(0.25))
        self.param_propagate_down = [True]

    def reshape(self, bottom, top):
        if not self.shared and bottom[0].shape[1] != self.blobs[0].count:
            raise self.error("bottom has %d channels, the layer has %d slopes"
                             % (bottom[0].shape[1], self.blobs[0].count))
        super().reshape(bottom, top)

    def _per_channel(self, array):
        # (N, C, rest) so that one slope broadcasts over its channel
        return array.reshape(array.shape[0], array.shape[1], -1)

    def _slopes(self):
        s = self.blobs[0].data
        return s.reshape(1, 1, 1) if self.shared else s.reshape(1, -1, 1)

    def forward(self, bottom, top):
        self._remember_input(bottom, top)
        x = self._per_channel(bottom[0].data)
        y = np.maximum(x, 0) + self._slopes() * np.minimum(x, 0)
        top[0].data[...] = y.reshape(top[0].shape)

    def backward(self, top, propagate_down, bottom):
        x = self._per_channel(self._input(bottom))
        dy = self._per_channel(top[0].diff)
        negative = x <= 0
        if self.param_propagate_down[0]:
            contribution = (dy * x * negative).sum(axis=(0, 2), dtype=np.float64)
            if self.shared:
                self.blobs[0].diff += contribution.sum()
            else:
                self.blobs[0].diff += contribution
        if propagate_down[0]:
            factor = np.where(negative, self._slopes(), 1.0)
            bottom[0].diff[...] = (dy * factor).reshape(bottom[0].shape)


@register("ELU")
class ELULayer(NeuronLayer):
    def setup(self, bottom, top):
        self.alpha = self.param.elu_param.alpha

    def forward(self, bottom, top):
        x = bottom[0].data
        negative_part = self.alpha * np.expm1(np.minimum(x, 0))
        top[0].data[...] = np.where(x > 0, x, negative_part)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x, y, dy = bottom[0].data, top[0].data, top[0].diff
        # d/dx alpha (e^x - 1) = y + alpha
        bottom[0].diff[...] = dy * np.where(x > 0, 1.0, y + self.alpha)


@register("Sigmoid")
class SigmoidLayer(NeuronLayer):
    def forward(self, bottom, top):
        # the tanh form never overflows
        top[0].data[...] = 0.5 * np.tanh(0.5 * bottom[0].data) + 0.5

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            y = top[0].data
            bottom[0].diff[...] = top[0].diff * y * (1 - y)


@register("TanH")
class TanHLayer(NeuronLayer):
    def forward(self, bottom, top):
        np.tanh(bottom[0].data, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            y = top[0].data
            bottom[0].diff[...] = top[0].diff * (1 - y * y)


@register("AbsVal")
class AbsValLayer(NeuronLayer):
    def reshape(self, bottom, top):
        if top[0] is bottom[0]:
            raise self.error("AbsVal does not allow in-place computation (top == bottom)")
        super().reshape(bottom, top)

    def forward(self, bottom, top):
        np.abs(bottom[0].data, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff * np.sign(bottom[0].data)


@register("BNLL")
class BNLLLayer(_InputKeepingLayer):
    """y = log(1 + e^x), computed without overflow."""
    EXP_LIMIT = 50.0       # Caffe's kBNLL_THRESHOLD on the exponent in backward

    def forward(self, bottom, top):
        self._remember_input(bottom, top)
        x = bottom[0].data
        top[0].data[...] = np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            e = np.exp(np.minimum(self._input(bottom), self.EXP_LIMIT))
            bottom[0].diff[...] = top[0].diff * e / (e + 1)


@register("Power")
class PowerLayer(_InputKeepingLayer):
    """y = (shift + scale * x) ^ power."""

    def setup(self, bottom, top):
        p = self.param.power_param
        self.power, self.scale, self.shift = p.power, p.scale, p.shift

    def forward(self, bottom, top):
        self._remember_input(bottom, top)
        base = self.shift + self.scale * bottom[0].data
        top[0].data[...] = base if self.power == 1 else np.power(base, self.power)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].diff
        diff_scale = self.power * self.scale
        if diff_scale == 0:
            bottom[0].diff[...] = 0
        elif self.power == 1:
            bottom[0].diff[...] = dy * diff_scale
        else:
            base = self.shift + self.scale * self._input(bottom)
            bottom[0].diff[...] = dy * diff_scale * np.power(base, self.power - 1)


def _log_base(layer, base):
    """ln(base), with Caffe's -1 meaning base e."""
    if base == -1:
        return 1.0
    if base <= 0:
        raise layer.error("base must be strictly positive (or -1 for e), got %g" % base)
    return float(np.log(base))


@register("Exp")
class ExpLayer(NeuronLayer):
    """y = base ^ (shift + scale * x)."""

    def setup(self, bottom, top):
        p = self.param.exp_param
        log_base = _log_base(self, p.base)
        self.inner_scale = log_base * p.scale
        self.outer_scale = 1.0 if p.shift == 0 else float(np.exp(log_base * p.shift))

    def forward(self, bottom, top):
        y = np.exp(self.inner_scale * bottom[0].data)
        if self.outer_scale != 1.0:
            y *= self.outer_scale
        top[0].data[...] = y

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff * top[0].data * self.inner_scale


@register("Log")
class LogLayer(_InputKeepingLayer):
    """y = log_base(shift + scale * x)."""

    def setup(self, bottom, top):
        p = self.param.log_param
        self.base_scale = 1.0 / _log_base(self, p.base)
        self.scale, self.shift = p.scale, p.shift

    def forward(self, bottom, top):
        self._remember_input(bottom, top)
        top[0].data[...] = np.log(self.shift + self.scale * bottom[0].data) * self.base_scale

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            inner = self.shift + self.scale * self._input(bottom)
            bottom[0].diff[...] = top[0].diff * (self.scale * self.base_scale) / inner


@register("Threshold")
class ThresholdLayer(NeuronLayer):
    """y = 1 where x > threshold, else 0; a step has no gradient, so there is no backward."""

    def setup(self, bottom, top):
        self.threshold = self.param.threshold_param.threshold

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data > self.threshold


@register("Clip")
class ClipLayer(_InputKeepingLayer):
    def setup(self, bottom, top):
        p = self.param.clip_param
        if not (p.HasField("min") and p.HasField("max")):
            raise self.error("clip_param needs both min and max")
        if p.min > p.max:
            raise self.error("clip_param.min (%g) is above clip_param.max (%g)" % (p.min, p.max))
        self.min, self.max = p.min, p.max

    def forward(self, bottom, top):
        self._remember_input(bottom, top)
        np.clip(bottom[0].data, self.min, self.max, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            x = self._input(bottom)
            bottom[0].diff[...] = top[0].diff * ((x >= self.min) & (x <= self.max))


@register("Swish")
class SwishLayer(NeuronLayer):
    """y = x * sigmoid(beta * x)."""

    def setup(self, bottom, top):
        self.beta = self.param.swish_param.beta

    def forward(self, bottom, top):
        x = bottom[0].data
        self._sigmoid = 0.5 * np.tanh(0.5 * self.beta * x) + 0.5
        top[0].data[...] = x * self._sigmoid

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            y, s = top[0].data, self._sigmoid
            by = self.beta * y
            bottom[0].diff[...] = top[0].diff * (by + s * (1 - by))


@register("Dropout")
class DropoutLayer(NeuronLayer):
    """At TRAIN, keep each value with probability 1 - p and scale it by 1 / (1 - p);
    at TEST, pass values through unchanged (Caffe's inverted dropout)."""

    def setup(self, bottom, top):
        ratio = self.param.dropout_param.dropout_ratio
        if not 0.0 <= ratio < 1.0:
            raise self.error("dropout_ratio must be in [0, 1), got %g" % ratio)
        self.ratio = ratio
        self.scale = 1.0 / (1.0 - ratio)

    def forward(self, bottom, top):
        x = bottom[0].data
        if self.phase == TRAIN:
            self._mask = get_rng().random(x.shape, dtype=np.float32) >= self.ratio
            top[0].data[...] = x * self._mask * np.float32(self.scale)
        elif top[0] is not bottom[0]:
            top[0].data[...] = x

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if self.phase == TRAIN:
            bottom[0].diff[...] = top[0].diff * self._mask * np.float32(self.scale)
        elif top[0] is not bottom[0]:
            bottom[0].diff[...] = top[0].diff
