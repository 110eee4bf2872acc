"""Layer family: neuron (elementwise) layers, Caffe's NeuronLayer subclasses.

All may run in place (top is bottom). Layers whose gradient is a function of the output (ReLU,
ELU, Sigmoid, TanH, Exp, Swish, Dropout) read the top data in backward, as Caffe does; layers whose
gradient needs the input keep a copy of it when running in place, so that their gradient stays
right where Caffe's would read the overwritten values.
"""
import numpy as np

from ..backend import dropout_bits
from ..blob import Blob
from ..fillers import constant_filler, fill
from ..rng import get_rng
from .base import TRAIN, NeuronLayer
from .registry import register


class _InputKeepingLayer(NeuronLayer):
    """A neuron layer whose backward needs the bottom data even when it runs in place."""

    def _remember_input(self, bottom, top):
        be = self.backend
        self._input_copy = (be.copy(bottom[0].dev_data, be.empty(bottom[0].shape))
                            if top[0] is bottom[0] else None)

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
    device_ready = True

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
        self.backend.neuron_forward("elu", bottom[0].dev_data, top[0].mutable_dev_data,
                                    self.alpha)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        self.backend.neuron_backward("elu", top[0].dev_diff, bottom[0].dev_data, top[0].dev_data,
                                     bottom[0].mutable_dev_diff, self.alpha)


class _OutputMapLayer(NeuronLayer):
    """A neuron map whose gradient reads its output (right in place too)."""
    device_ready = True
    kind = None

    def forward(self, bottom, top):
        self.backend.neuron_forward(self.kind, bottom[0].dev_data, top[0].mutable_dev_data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.backend.neuron_backward(self.kind, top[0].dev_diff, top[0].dev_data,
                                         bottom[0].mutable_dev_diff)


@register("Sigmoid")
class SigmoidLayer(_OutputMapLayer):
    kind = "sigmoid"


@register("TanH")
class TanHLayer(_OutputMapLayer):
    kind = "tanh"


class _InputMapLayer(_InputKeepingLayer):
    """A neuron map whose gradient reads its input (kept when it runs in place)."""
    device_ready = True
    kind = None

    def forward_params(self):
        return ()

    def backward_params(self):
        return self.forward_params()

    def forward(self, bottom, top):
        self._remember_input(bottom, top)
        self.backend.neuron_forward(self.kind, bottom[0].dev_data, top[0].mutable_dev_data,
                                    *self.forward_params())

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.backend.neuron_backward(self.kind, top[0].dev_diff, self._input(bottom),
                                         bottom[0].mutable_dev_diff, *self.backward_params())


@register("AbsVal")
class AbsValLayer(_InputMapLayer):
    kind = "abs"

    def reshape(self, bottom, top):
        if top[0] is bottom[0]:
            raise self.error("AbsVal does not allow in-place computation (top == bottom)")
        super().reshape(bottom, top)


@register("BNLL")
class BNLLLayer(_InputMapLayer):
    """y = log(1 + e^x), computed without overflow."""
    kind = "bnll"


@register("Power")
class PowerLayer(_InputMapLayer):
    """y = (shift + scale * x) ^ power."""
    kind = "power"

    def setup(self, bottom, top):
        p = self.param.power_param
        self.power, self.scale, self.shift = p.power, p.scale, p.shift

    def forward_params(self):
        return self.power, self.scale, self.shift

    def backward_params(self):
        return self.power, self.scale, self.shift, self.power * self.scale


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
        self.backend.neuron_forward("exp", bottom[0].dev_data, top[0].mutable_dev_data,
                                    self.inner_scale, self.outer_scale)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.backend.neuron_backward("exp", top[0].dev_diff, top[0].dev_data,
                                         bottom[0].mutable_dev_diff, self.inner_scale)


@register("Log")
class LogLayer(_InputMapLayer):
    """y = log_base(shift + scale * x)."""
    kind = "log"

    def setup(self, bottom, top):
        p = self.param.log_param
        self.base_scale = 1.0 / _log_base(self, p.base)
        self.scale, self.shift = p.scale, p.shift

    def forward_params(self):
        return self.scale, self.shift, self.base_scale

    def backward_params(self):
        return self.scale, self.shift, self.scale * self.base_scale


@register("Threshold")
class ThresholdLayer(NeuronLayer):
    """y = 1 where x > threshold, else 0; a step has no gradient, so there is no backward."""
    device_ready = True

    def setup(self, bottom, top):
        self.threshold = self.param.threshold_param.threshold

    def forward(self, bottom, top):
        self.backend.neuron_forward("threshold", bottom[0].dev_data, top[0].mutable_dev_data,
                                    self.threshold)


@register("Clip")
class ClipLayer(_InputMapLayer):
    kind = "clip"

    def setup(self, bottom, top):
        p = self.param.clip_param
        if not (p.HasField("min") and p.HasField("max")):
            raise self.error("clip_param needs both min and max")
        if p.min > p.max:
            raise self.error("clip_param.min (%g) is above clip_param.max (%g)" % (p.min, p.max))
        self.min, self.max = p.min, p.max

    def forward_params(self):
        return self.min, self.max


@register("Swish")
class SwishLayer(NeuronLayer):
    """y = x * sigmoid(beta * x)."""
    device_ready = True

    def setup(self, bottom, top):
        self.beta = self.param.swish_param.beta

    def forward(self, bottom, top):
        self._sigmoid = self.backend.neuron_forward(
            "swish", bottom[0].dev_data, top[0].mutable_dev_data, 0.5 * self.beta)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.backend.neuron_backward("swish", top[0].dev_diff, top[0].dev_data,
                                         self._sigmoid, bottom[0].mutable_dev_diff, self.beta)


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
            # the key comes from the host stream and every backend hashes it alike, so runs
            # agree; backward reads the same draws
            self._draws = self.backend.dropout_forward(
                x, top[0].mutable_dev_data, dropout_bits.draw_key(get_rng()), self.ratio,
                self.scale)
        elif top[0] is not bottom[0]:
            self.backend.copy(x, top[0].mutable_dev_data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if self.phase == TRAIN:
            self.backend.dropout_backward(self._draws, top[0].dev_diff,
                                          bottom[0].mutable_dev_diff, self.ratio, self.scale)
        elif top[0] is not bottom[0]:
            self.backend.copy(top[0].dev_diff, bottom[0].mutable_dev_diff)
