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
    device_ready = True

    def _remember_input(self, bottom, top):
        if top[0] is bottom[0]:
            x = bottom[0].dev_data
            self._input_copy = self.backend.copy(x, self.backend.empty(x.shape))
        else:
            self._input_copy = None

    def _input(self, bottom):
        return self._input_copy if self._input_copy is not None else bottom[0].dev_data


@register("ReLU")
class ReLULayer(NeuronLayer):
    device_ready = True

    def setup(self, bottom, top):
        self.slope = self.param.relu_param.negative_slope

    def forward(self, bottom, top):
        self.backend.relu_forward(bottom[0].dev_data, top[0].mutable_dev_data, self.slope)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        # in place this reads the output, whose sign is the input's for a non-negative slope
        self.backend.relu_backward(bottom[0].dev_data, top[0].dev_diff,
                                   bottom[0].mutable_dev_diff, self.slope)


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

    def forward(self, bottom, top):
        self._remember_input(bottom, top)
        self.backend.prelu_forward(self._per_channel(bottom[0].dev_data),
                                   self._per_channel(top[0].mutable_dev_data),
                                   self.blobs[0].dev_data, self.shared)

    def backward(self, top, propagate_down, bottom):
        if not (propagate_down[0] or self.param_propagate_down[0]):
            return
        self.backend.prelu_backward(
            self._per_channel(self._input(bottom)), self._per_channel(top[0].dev_diff),
            self.blobs[0].dev_data, self.shared,
            dx=self._per_channel(bottom[0].mutable_dev_diff) if propagate_down[0] else None,
            dslopes=self.blobs[0].mutable_dev_diff if self.param_propagate_down[0] else None)


@register("ELU")
class ELULayer(NeuronLayer):
    device_ready = True

    def setup(self, bottom, top):
        self.alpha = self.param.elu_param.alpha

    def forward(self, bottom, top):
        self.backend.elu_forward(bottom[0].dev_data, top[0].mutable_dev_data, self.alpha)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        self.backend.elu_backward(bottom[0].dev_data, top[0].dev_data, top[0].dev_diff,
                                  bottom[0].mutable_dev_diff, self.alpha)


@register("Sigmoid")
class SigmoidLayer(NeuronLayer):
    device_ready = True

    def forward(self, bottom, top):
        self.backend.sigmoid_forward(bottom[0].dev_data, top[0].mutable_dev_data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.backend.sigmoid_backward(top[0].dev_data, top[0].dev_diff,
                                          bottom[0].mutable_dev_diff)


@register("TanH")
class TanHLayer(NeuronLayer):
    device_ready = True

    def forward(self, bottom, top):
        self.backend.tanh_forward(bottom[0].dev_data, top[0].mutable_dev_data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.backend.tanh_backward(top[0].dev_data, top[0].dev_diff,
                                       bottom[0].mutable_dev_diff)


@register("AbsVal")
class AbsValLayer(NeuronLayer):
    device_ready = True

    def reshape(self, bottom, top):
        if top[0] is bottom[0]:
            raise self.error("AbsVal does not allow in-place computation (top == bottom)")
        super().reshape(bottom, top)

    def forward(self, bottom, top):
        self.backend.abs_forward(bottom[0].dev_data, top[0].mutable_dev_data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.backend.abs_backward(bottom[0].dev_data, top[0].dev_diff,
                                      bottom[0].mutable_dev_diff)


@register("BNLL")
class BNLLLayer(_InputKeepingLayer):
    """y = log(1 + e^x), computed without overflow."""
    EXP_LIMIT = 50.0       # Caffe's kBNLL_THRESHOLD on the exponent in backward

    def forward(self, bottom, top):
        self._remember_input(bottom, top)
        self.backend.bnll_forward(bottom[0].dev_data, top[0].mutable_dev_data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.backend.bnll_backward(self._input(bottom), top[0].dev_diff,
                                       bottom[0].mutable_dev_diff, self.EXP_LIMIT)


@register("Power")
class PowerLayer(_InputKeepingLayer):
    """y = (shift + scale * x) ^ power."""

    def setup(self, bottom, top):
        p = self.param.power_param
        self.power, self.scale, self.shift = p.power, p.scale, p.shift

    def forward(self, bottom, top):
        self._remember_input(bottom, top)
        self.backend.power_forward(bottom[0].dev_data, top[0].mutable_dev_data, self.power,
                                   self.scale, self.shift)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.backend.power_backward(self._input(bottom), top[0].dev_diff,
                                        bottom[0].mutable_dev_diff, self.power, self.scale,
                                        self.shift)


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
    device_ready = True

    def setup(self, bottom, top):
        p = self.param.exp_param
        log_base = _log_base(self, p.base)
        self.inner_scale = log_base * p.scale
        self.outer_scale = 1.0 if p.shift == 0 else float(np.exp(log_base * p.shift))

    def forward(self, bottom, top):
        self.backend.exp_forward(bottom[0].dev_data, top[0].mutable_dev_data, self.inner_scale,
                                 self.outer_scale)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.backend.exp_backward(top[0].dev_data, top[0].dev_diff,
                                      bottom[0].mutable_dev_diff, self.inner_scale)


@register("Log")
class LogLayer(_InputKeepingLayer):
    """y = log_base(shift + scale * x)."""

    def setup(self, bottom, top):
        p = self.param.log_param
        self.base_scale = 1.0 / _log_base(self, p.base)
        self.scale, self.shift = p.scale, p.shift

    def forward(self, bottom, top):
        self._remember_input(bottom, top)
        self.backend.log_forward(bottom[0].dev_data, top[0].mutable_dev_data, self.scale,
                                 self.shift, self.base_scale)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.backend.log_backward(self._input(bottom), top[0].dev_diff,
                                      bottom[0].mutable_dev_diff, self.scale, self.shift,
                                      self.base_scale)


@register("Threshold")
class ThresholdLayer(NeuronLayer):
    """y = 1 where x > threshold, else 0; a step has no gradient, so there is no backward."""
    device_ready = True

    def setup(self, bottom, top):
        self.threshold = self.param.threshold_param.threshold

    def forward(self, bottom, top):
        self.backend.threshold_forward(bottom[0].dev_data, top[0].mutable_dev_data,
                                       self.threshold)


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
        self.backend.clip_forward(bottom[0].dev_data, top[0].mutable_dev_data, self.min,
                                  self.max)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.backend.clip_backward(self._input(bottom), top[0].dev_diff,
                                       bottom[0].mutable_dev_diff, self.min, self.max)


@register("Swish")
class SwishLayer(NeuronLayer):
    """y = x * sigmoid(beta * x)."""
    device_ready = True

    def setup(self, bottom, top):
        self.beta = self.param.swish_param.beta

    def forward(self, bottom, top):
        self._sigmoid = self.backend.swish_forward(bottom[0].dev_data, top[0].mutable_dev_data,
                                                   self.beta)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.backend.swish_backward(top[0].dev_data, self._sigmoid, top[0].dev_diff,
                                        bottom[0].mutable_dev_diff, self.beta)


@register("Dropout")
class DropoutLayer(NeuronLayer):
    """At TRAIN, keep each value with probability 1 - p and scale it by 1 / (1 - p);
    at TEST, pass values through unchanged (Caffe's inverted dropout)."""
    device_ready = True

    def setup(self, bottom, top):
        ratio = self.param.dropout_param.dropout_ratio
        if not 0.0 <= ratio < 1.0:
            raise self.error("dropout_ratio must be in [0, 1), got %g" % ratio)
        self.ratio = ratio
        self.scale = 1.0 / (1.0 - ratio)

    def forward(self, bottom, top):
        x = bottom[0].dev_data
        if self.phase == TRAIN:
            # the draws come from the host stream on every backend, so runs agree
            self._mask = self.backend.dropout_forward(
                x, top[0].mutable_dev_data, get_rng().random(x.shape, dtype=np.float32),
                self.ratio, self.scale)
        elif top[0] is not bottom[0]:
            self.backend.copy(x, top[0].mutable_dev_data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if self.phase == TRAIN:
            self.backend.dropout_backward(self._mask, top[0].dev_diff,
                                          bottom[0].mutable_dev_diff, self.ratio, self.scale)
        elif top[0] is not bottom[0]:
            self.backend.copy(top[0].dev_diff, bottom[0].mutable_dev_diff)
