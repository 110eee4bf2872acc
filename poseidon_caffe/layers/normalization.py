"""Layer family: normalization and per-channel affine maps (BatchNorm, Scale, Bias, MVN)."""
from ..blob import Blob
from ..fillers import constant_filler, fill
from .base import TEST, Layer
from .registry import register


@register("BatchNorm")
class BatchNormLayer(Layer):
    """Normalise each channel (axis 1) by its mean and variance over the batch and space.

    The three blobs are stored as Caffe stores them: the running sums of the means and of the
    (unbiased) variances, each decayed by moving_average_fraction, and in blob 2 the matching
    sum of decay weights; the global statistics are blob 0 and blob 1 divided by blob 2.
    They are statistics, not learned parameters: backward never writes their diffs.
    """
    device_ready = True
    exact_bottoms = 1
    exact_tops = 1

    def setup(self, bottom, top):
        p = self.param.batch_norm_param
        self.use_global_stats = (p.use_global_stats if p.HasField("use_global_stats")
                                 else self.phase == TEST)
        self.fraction = p.moving_average_fraction
        self.eps = p.eps
        # a negative eps takes the square root of a negative variance for constant inputs
        if self.eps < 0:
            raise self.error("batch_norm_param.eps must be >= 0 (got %g)" % self.eps)
        if not 0.0 <= self.fraction <= 1.0:
            raise self.error("batch_norm_param.moving_average_fraction must be in [0, 1] "
                             "(got %g)" % self.fraction)
        self.channels = bottom[0].shape[1] if bottom[0].num_axes > 1 else 1
        shapes = [(self.channels,), (self.channels,), (1,)]
        if self.blobs:
            self.check_loaded_blobs(
                shapes, count_text="expected {want} statistics blobs (mean, variance, scale "
                                   "factor), the model gives {got}",
                shape_text="statistics blob {which} has shape {got}, expected {want}")
        else:
            self.blobs = [Blob(shape) for shape in shapes]      # zeros, as Caffe starts them
        self._freeze_statistics()
        self.param_propagate_down = [False, False, False]

    def _freeze_statistics(self):
        # As Caffe does: the statistics get param specs with lr_mult 0 (added to the layer's
        # parameters, which the net reads next), so no solver ever decays or moves them.
        specs = self.param.param
        for i in range(len(self.blobs)):
            if i == len(specs):
                specs.add().lr_mult = 0.0
            elif specs[i].lr_mult != 0:
                raise self.error("param %d has lr_mult %g: batch normalization statistics "
                                 "cannot be configured as learned parameters (use lr_mult: 0)"
                                 % (i, specs[i].lr_mult))

    def reshape(self, bottom, top):
        channels = bottom[0].shape[1] if bottom[0].num_axes > 1 else 1
        if bottom[0].num_axes < 1 or channels != self.channels:
            raise self.error("bottom shape %s does not have the %d channels the layer was set up "
                             "with" % (bottom[0].shape, self.channels))
        top[0].reshape(bottom[0].shape)

    def _by_channel(self, array):
        return array.reshape(array.shape[0], self.channels, -1)

    def forward(self, bottom, top):
        be = self.backend
        x = self._by_channel(bottom[0].dev_data)
        # kept apart from top, which a later in-place layer (Scale) may overwrite
        normalised = be.empty(x.shape)
        if self.use_global_stats:
            stored = float(self.blobs[2].data[0])
            factor = 0.0 if stored == 0 else 1.0 / stored
            self._std = be.batchnorm_global(x, self.blobs[0].dev_data, self.blobs[1].dev_data,
                                            factor, self.eps, normalised)
        else:
            self._std, mean, variance = be.batchnorm_batch(x, self.eps, normalised)
            self._update_running_stats(mean, variance, x.size // self.channels)
        self._normalised = normalised
        be.copy(normalised, top[0].mutable_dev_data)

    def _update_running_stats(self, mean, variance, m):
        # Caffe stores the unbiased variance: the batch variance times m / (m - 1)
        correction = m / (m - 1.0) if m > 1 else 1.0
        self.blobs[2].data[...] = self.blobs[2].data * self.fraction + 1
        self.backend.running_average(self.blobs[0].mutable_dev_data, self.fraction, mean)
        self.backend.running_average(self.blobs[1].mutable_dev_data, self.fraction, variance,
                                     correction)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        self.backend.batchnorm_backward(self._by_channel(top[0].dev_diff), self._normalised,
                                        self._std, self.use_global_stats,
                                        self._by_channel(bottom[0].mutable_dev_diff))


class _BroadcastLayer(Layer):
    """Shared shape logic of Scale and Bias: a second operand of shape
    bottom[0].shape[axis:axis + k], taken from bottom[1] or learned, broadcast over the rest."""
    min_bottoms = 1
    max_bottoms = 2
    exact_tops = 1

    def _axis(self, bottom0, operand_axes, axis):
        if operand_axes == 0:
            return 0                 # a scalar operand covers the whole blob
        try:
            return bottom0.canonical_axis_index(axis)
        except ValueError as exc:
            raise self.error(str(exc)) from None

    def _learned_shape(self, bottom0, axis, num_axes, field):
        if num_axes < -1:
            raise self.error("%s.num_axes must be -1 or more, got %d" % (field, num_axes))
        start = self._axis(bottom0, num_axes, axis)
        if num_axes == -1:
            return bottom0.shape[start:]
        if start + num_axes > bottom0.num_axes:
            raise self.error("%s.axis %d plus num_axes %d exceeds the %d axes of bottom %s"
                             % (field, axis, num_axes, bottom0.num_axes, bottom0.shape))
        return bottom0.shape[start:start + num_axes]

    def _fit(self, bottom0, operand, axis, what):
        """(outer, dim, inner) for broadcasting ``operand`` over bottom0 from ``axis``."""
        start = self._axis(bottom0, operand.num_axes, axis)
        end = start + operand.num_axes
        if end > bottom0.num_axes or bottom0.shape[start:end] != operand.shape:
            raise self.error("%s of shape %s does not match bottom %s from axis %d"
                             % (what, operand.shape, bottom0.shape, start))
        return bottom0.count_axes(0, start), operand.count, bottom0.count_axes(end)

    def _split(self, array):
        return array.reshape(self.outer, self.dim, self.inner)


@register("Scale")
class ScaleLayer(_BroadcastLayer):
    """top = bottom[0] * scale (+ bias), scale from bottom[1] or learned."""
    device_ready = True

    def setup(self, bottom, top):
        p = self.param.scale_param
        self.bias_term = p.bias_term
        if len(bottom) == 1:
            scale_shape = self._learned_shape(bottom[0], p.axis, p.num_axes, "scale_param")
        else:
            scale_shape = bottom[1].shape
        shapes = ([scale_shape] if len(bottom) == 1 else []) + ([scale_shape]
                                                                if self.bias_term else [])
        if self.blobs:
            self.check_loaded_blobs(shapes)
        else:
            self.blobs = [Blob(shape) for shape in shapes]
            if len(bottom) == 1:
                fill(self.blobs[0], p.filler if p.HasField("filler") else constant_filler(1.0))
            if self.bias_term:
                fill(self.blobs[-1], p.bias_filler)
        self.bias_index = len(self.blobs) - 1 if self.bias_term else None
        self.param_propagate_down = [True] * len(self.blobs)

    def _scale(self, bottom):
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        scale = self._scale(bottom)
        self.outer, self.dim, self.inner = self._fit(bottom[0], scale,
                                                     self.param.scale_param.axis, "scale")
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        be = self.backend
        x = bottom[0].dev_data
        self._input = be.copy(x, be.empty(x.shape)) if top[0] is bottom[0] else None
        bias = self.blobs[self.bias_index].dev_data if self.bias_term else None
        be.scale_forward(self._split(x), self._scale(bottom).dev_data.reshape(-1),
                         None if bias is None else bias.reshape(-1),
                         self._split(top[0].mutable_dev_data))

    def backward(self, top, propagate_down, bottom):
        be = self.backend
        dy = self._split(top[0].dev_diff)
        if self.bias_term and self.param_propagate_down[self.bias_index]:
            be.broadcast_grad(dy, self.blobs[self.bias_index].mutable_dev_diff, True)
        scale = self._scale(bottom)
        from_bottom = len(bottom) > 1
        if (from_bottom and propagate_down[1]) or (not from_bottom and
                                                   self.param_propagate_down[0]):
            x = self._input if self._input is not None else bottom[0].dev_data
            be.broadcast_grad(dy, scale.mutable_dev_diff, not from_bottom, self._split(x))
        if propagate_down[0]:
            be.scale_backward(None, scale.dev_data.reshape(-1), dy,
                              self._split(bottom[0].mutable_dev_diff))


@register("Bias")
class BiasLayer(_BroadcastLayer):
    """top = bottom[0] + bias, bias from bottom[1] or learned."""
    device_ready = True

    def setup(self, bottom, top):
        p = self.param.bias_param
        if len(bottom) == 1:
            shape = self._learned_shape(bottom[0], p.axis, p.num_axes, "bias_param")
            if self.blobs:
                self.check_loaded_blobs([shape])
            else:
                self.blobs = [Blob(shape)]
                fill(self.blobs[0], p.filler)
        elif self.blobs:
            raise self.error("a bias given as bottom 1 leaves no parameter blobs, the model "
                             "gives %d" % len(self.blobs))
        self.param_propagate_down = [True] * len(self.blobs)

    def _bias(self, bottom):
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        self.outer, self.dim, self.inner = self._fit(bottom[0], self._bias(bottom),
                                                     self.param.bias_param.axis, "bias")
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        be = self.backend
        x = self._split(bottom[0].dev_data)
        y = self._split(top[0].mutable_dev_data)
        if top[0] is not bottom[0]:
            be.copy(x, y)
        be.add_bias(y, self._bias(bottom).dev_data.reshape(-1))

    def backward(self, top, propagate_down, bottom):
        be = self.backend
        dy = self._split(top[0].dev_diff)
        bias = self._bias(bottom)
        if len(bottom) > 1:
            if propagate_down[1]:
                be.broadcast_grad(dy, bias.mutable_dev_diff, False)
        elif self.param_propagate_down[0]:
            be.broadcast_grad(dy, bias.mutable_dev_diff, True)
        if propagate_down[0] and top[0] is not bottom[0]:
            be.copy(dy, bottom[0].mutable_dev_diff)


@register("MVN")
class MVNLayer(Layer):
    """Subtract the mean (and divide by std + eps) over each (num, channel) plane, or over each
    item's channels and space together with across_channels."""
    device_ready = True
    exact_bottoms = 1
    exact_tops = 1

    def setup(self, bottom, top):
        p = self.param.mvn_param
        self.normalize_variance = p.normalize_variance
        self.across_channels = p.across_channels
        self.eps = p.eps
        if self.eps < 0:
            raise self.error("mvn_param.eps must be >= 0 (got %g)" % self.eps)

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if not shape:
            raise self.error("bottom needs at least one axis")
        rows = shape[0] if self.across_channels or len(shape) < 2 else shape[0] * shape[1]
        self.rows = rows
        top[0].reshape(shape)

    def _rows(self, array):
        return array.reshape(self.rows, -1)

    def forward(self, bottom, top):
        self._std = self.backend.mvn_forward(self._rows(bottom[0].dev_data),
                                             self.normalize_variance, self.eps,
                                             self._rows(top[0].mutable_dev_data))

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        y = self._rows(top[0].dev_data) if self.normalize_variance else None
        self.backend.mvn_backward(self._rows(top[0].dev_diff), y, self._std,
                                  self._rows(bottom[0].mutable_dev_diff))
