"""Layer family: loss layers, Softmax and Accuracy, with Caffe's normalisation rules.

Every loss writes a scalar into ``top[0]`` (a 0-axis blob). Backward scales by ``top[0].diff``,
which the net seeds with the loss weight. On a device, SoftmaxWithLoss and EuclideanLoss sum
and normalise there and write the scalar into the top's device memory: nothing is read to the
host until someone reads the loss (the solver's display); a label out of range then shows as
a NaN loss rather than by name.
"""
import math

import numpy as np

from .base import Layer, LossLayer
from .registry import register
from ..proto import caffe_pb2

_Norm = caffe_pb2.LossParameter
LOG_THRESHOLD = 1e-20                       # Caffe's kLOG_THRESHOLD
FLT_MIN = float(np.finfo(np.float32).tiny)  # Caffe's FLT_MIN, the floor inside log(prob)


def softmax_along(xp, x3):
    """Softmax over axis 1 of an (outer, channels, inner) array, shifted by the max for safety."""
    e = xp.exp(x3 - x3.max(axis=1, keepdims=True))
    e /= e.sum(axis=1, keepdims=True)
    return e


def split_at_axis(shape, axis):
    """(outer, channels, inner) counts around ``axis``, as Caffe's count(0, a) / count(a + 1)."""
    # math.prod: numpy's costs more than the layer's own work at small shapes
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def normalization_mode(layer, allow_legacy=True, legacy_default=None):
    """Caffe's rule: an explicit ``normalization`` wins; else the legacy ``normalize`` bool
    (true = VALID, false = BATCH_SIZE); else ``legacy_default`` or the schema's default."""
    lp = layer.param.loss_param
    if lp.HasField("normalization"):
        return lp.normalization
    if lp.HasField("normalize"):
        if not allow_legacy:
            raise layer.error('loss_param.normalize is deprecated; use "normalization"')
        return _Norm.VALID if lp.normalize else _Norm.BATCH_SIZE
    return lp.normalization if legacy_default is None else legacy_default


def normalizer(mode, outer, inner, valid_count):
    """The divisor of the summed loss; at least 1 so an all-ignored batch gives 0, not NaN."""
    if mode == _Norm.FULL:
        value = outer * inner
    elif mode == _Norm.VALID:
        value = outer * inner if valid_count < 0 else valid_count
    elif mode == _Norm.BATCH_SIZE:
        value = outer
    elif mode == _Norm.NONE:
        value = 1
    else:
        raise ValueError("unknown loss normalization mode %r" % mode)
    return max(1.0, float(value))


class _LabelReader:
    """Integer labels along an axis, with loss_param.ignore_label (losses and Accuracy)."""

    def _read_ignore_label(self, source=None):
        lp = self.param.loss_param if source is None else source
        self.has_ignore_label = lp.HasField("ignore_label")
        self.ignore_label = lp.ignore_label

    def _labels(self, label_blob, outer, inner, channels):
        """Integer labels (outer, inner), a validity mask, and labels safe to index with (host
        arrays: on a device backend this reads the labels back, which only an error path
        does)."""
        labels = label_blob.data.reshape(outer, inner).astype(np.int64)
        valid = np.ones(labels.shape, dtype=bool)
        if self.has_ignore_label:
            valid = labels != self.ignore_label
        bad = valid & ((labels < 0) | (labels >= channels))
        if bool(bad.any()):
            raise self.error("label %d is out of range: labels must be integers in [0, %d)"
                             % (int(labels[bad].ravel()[0]), channels))
        return labels, valid, np.where(valid, labels, 0)

    def _check_label_count(self, bottom, axis_name, axis):
        if self.outer * self.inner != bottom[1].count:
            raise self.error(
                "Number of labels must match number of predictions; e.g., if %s axis == %d and "
                "prediction shape is (N, C, H, W), label count (number of labels) must be "
                "N*H*W, with integer values in {0, 1, ..., C-1}. Got predictions %s and %d "
                "labels." % (axis_name, axis, bottom[0].shape, bottom[1].count))


class _LabelledLoss(_LabelReader, LossLayer):
    pass


@register("Softmax")
class SoftmaxLayer(Layer):
    device_ready = True
    exact_bottoms = 1
    exact_tops = 1

    def reshape(self, bottom, top):
        self.axis = bottom[0].canonical_axis_index(self.param.softmax_param.axis)
        self.split = split_at_axis(bottom[0].shape, self.axis)
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        self.backend.softmax_forward(bottom[0].dev_data.reshape(self.split),
                                     top[0].mutable_dev_data.reshape(self.split))

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        self.backend.softmax_backward(top[0].dev_data.reshape(self.split),
                                      top[0].dev_diff.reshape(self.split),
                                      bottom[0].mutable_dev_diff.reshape(self.split))


@register("SoftmaxWithLoss")
class SoftmaxWithLossLayer(_LabelledLoss):
    device_ready = True
    exact_tops = None
    min_tops = 1
    max_tops = 2

    def setup(self, bottom, top):
        self._read_ignore_label()
        self.normalization = normalization_mode(self)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.axis = bottom[0].canonical_axis_index(self.param.softmax_param.axis)
        self.outer, self.channels, self.inner = split_at_axis(bottom[0].shape, self.axis)
        self._check_label_count(bottom, "softmax", self.axis)
        if len(top) >= 2:
            top[1].reshape(bottom[0].shape)

    def _ignored(self):
        return self.ignore_label if self.has_ignore_label else None

    def forward(self, bottom, top):
        be = self.backend
        split = (self.outer, self.channels, self.inner)
        prob = be.softmax_forward(bottom[0].dev_data.reshape(split), be.empty(split))
        self.prob = prob
        if be.on_device:
            self._forward_on_device(prob, bottom, top)
            return
        loss, count = be.softmax_loss_forward(prob, bottom[1].dev_data, self._ignored())
        if loss != loss:
            # NaN: a label out of range names itself here (else the net itself diverged)
            self._labels(bottom[1], self.outer, self.inner, self.channels)
        self.norm = normalizer(self.normalization, self.outer, self.inner, int(count))
        top[0].data[...] = loss / self.norm
        if len(top) == 2:
            be.copy(prob, top[1].mutable_dev_data.reshape(split))

    def _forward_on_device(self, prob, bottom, top):
        be = self.backend
        # as Caffe, the count of labels is read to the host only when some may be ignored
        counted = self.normalization == _Norm.VALID and self.has_ignore_label
        out = top[0].mutable_dev_data.reshape(1)
        count = be.softmax_loss_forward_on_device(prob, bottom[1].dev_data, self._ignored(),
                                                  out, count=counted)
        self.norm = normalizer(self.normalization, self.outer, self.inner,
                               int(count) if counted else -1)
        be.divide(out, self.norm, out)
        if len(top) == 2:
            be.copy(prob, top[1].mutable_dev_data.reshape(prob.shape))

    def backward(self, top, propagate_down, bottom):
        if len(propagate_down) > 1 and propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs")
        if not propagate_down[0]:
            return
        self.backend.softmax_loss_backward(
            self.prob, bottom[1].dev_data, self._ignored(), float(top[0].diff) / self.norm,
            bottom[0].mutable_dev_diff.reshape(self.prob.shape))


@register("Accuracy")
class AccuracyLayer(_LabelReader, Layer):
    """Top-k accuracy; a label counts as hit when fewer than top_k scores are >= its score.
    Not a loss (weight 0 by default) and without a gradient."""
    device_ready = True
    exact_bottoms = 2
    min_tops = 1
    max_tops = 2

    def setup(self, bottom, top):
        self._read_ignore_label(self.param.accuracy_param)
        self.top_k = self.param.accuracy_param.top_k

    def reshape(self, bottom, top):
        if self.top_k > bottom[0].count // max(bottom[1].count, 1):
            raise self.error("top_k must be less than or equal to the number of classes "
                             "(top_k %d, predictions %s, %d labels)"
                             % (self.top_k, bottom[0].shape, bottom[1].count))
        self.axis = bottom[0].canonical_axis_index(self.param.accuracy_param.axis)
        self.outer, self.channels, self.inner = split_at_axis(bottom[0].shape, self.axis)
        self._check_label_count(bottom, "label", self.axis)
        top[0].reshape(())
        if len(top) > 1:
            top[1].reshape((self.channels,))

    def forward(self, bottom, top):
        scores = bottom[0].dev_data.reshape(self.outer, self.channels, self.inner)
        ignore = self.ignore_label if self.has_ignore_label else None
        result = self.backend.accuracy(scores, bottom[1].dev_data, self.top_k, ignore,
                                       per_class=len(top) > 1)
        hits, count = result[0], int(result[1])
        if hits != hits:
            # NaN: a label out of range; name it
            self._labels(bottom[1], self.outer, self.inner, self.channels)
        top[0].data[...] = hits / count if count else 0.0
        if len(top) > 1:
            top[1].data[...] = result[2]


@register("EuclideanLoss")
class EuclideanLossLayer(LossLayer):
    """sum((a - b)^2) / (2 num); gradients flow to both inputs."""
    device_ready = True

    def allow_force_backward(self, bottom_index):
        return True

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if bottom[0].count_axes(1) != bottom[1].count_axes(1):
            raise self.error("Inputs must have the same dimension: %s vs %s"
                             % (bottom[0].shape, bottom[1].shape))
        if getattr(self, "delta", None) is None or self.delta.shape != bottom[0].shape:
            self.delta = self.backend.empty(bottom[0].shape)

    def forward(self, bottom, top):
        be = self.backend
        a = bottom[0].dev_data
        be.subtract(a, bottom[1].dev_data.reshape(a.shape), self.delta)
        if be.on_device:
            out = top[0].mutable_dev_data.reshape(1)
            be.sum_into(self.delta, out, squares=True)
            # one division by 2 num rounds as the host's s / num / 2 (halving is exact)
            be.divide(out, 2.0 * bottom[0].shape[0], out)
            return
        top[0].data[...] = be.sumsq(self.delta) / bottom[0].shape[0] / 2.0

    def backward(self, top, propagate_down, bottom):
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                alpha = sign * float(top[0].diff) / bottom[i].shape[0]
                self.backend.scale(alpha, self.delta,
                                   out=bottom[i].mutable_dev_diff.reshape(self.delta.shape))


@register("HingeLoss")
class HingeLossLayer(LossLayer):
    """One-vs-all hinge: t = max(0, 1 - y_k x_k) with y = +1 for the label, -1 otherwise;
    L1 sums t, L2 sums t^2, both divided by num."""
    device_ready = True

    def _bad_labels(self, bottom, dim):
        return self.error("needs one label per item in [0, %d); got labels %s"
                          % (dim, bottom[1].shape))

    def forward(self, bottom, top):
        num = bottom[0].shape[0]
        x = bottom[0].dev_data.reshape(num, -1)
        if bottom[1].count != num:
            raise self._bad_labels(bottom, x.shape[1])
        self.l2 = self.param.hinge_loss_param.norm == caffe_pb2.HingeLossParameter.L2
        loss, self.state = self.backend.hinge_forward(x, bottom[1].dev_data, self.l2)
        if loss != loss:
            # NaN: a label out of range (read on the host only now), else the data's own NaN
            labels = bottom[1].data.reshape(-1).astype(np.int64)
            if bool(((labels < 0) | (labels >= x.shape[1])).any()):
                raise self._bad_labels(bottom, x.shape[1])
        top[0].data[...] = loss / num

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs")
        if not propagate_down[0]:
            return
        num = bottom[0].shape[0]
        self.backend.hinge_backward(self.state, bottom[1].dev_data, self.l2,
                                    float(top[0].diff) / num,
                                    bottom[0].mutable_dev_diff.reshape(num, -1))


@register("ContrastiveLoss")
class ContrastiveLossLayer(LossLayer):
    """Pairs (a, b) with similarity y: y d^2 + (1 - y) max(margin - d, 0)^2, over 2 num
    (legacy_version: (1 - y) max(margin - d^2, 0))."""
    device_ready = True
    exact_bottoms = 3

    def allow_force_backward(self, bottom_index):
        return bottom_index != 2

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        a, b, y = bottom
        if a.shape[1:] != b.shape[1:] or a.num_axes < 2 or a.count_axes(2) != 1:
            raise self.error("the two feature bottoms must be N x C (x 1 x 1) and alike; got "
                             "%s and %s" % (a.shape, b.shape))
        if y.count != a.shape[0]:
            raise self.error("the similarity bottom needs one value per pair (N x 1 x 1 x 1); "
                             "got %s for %d pairs" % (y.shape, a.shape[0]))

    def _pairs(self, bottom):
        num = bottom[0].shape[0]
        return bottom[0].dev_data.reshape(num, -1), bottom[1].dev_data.reshape(num, -1)

    def forward(self, bottom, top):
        p = self.param.contrastive_loss_param
        a, b = self._pairs(bottom)
        loss, self.state = self.backend.contrastive_forward(a, b, bottom[2].dev_data, p.margin,
                                                            p.legacy_version)
        top[0].data[...] = loss / bottom[0].shape[0] / 2.0

    def backward(self, top, propagate_down, bottom):
        p = self.param.contrastive_loss_param
        num = bottom[0].shape[0]
        outputs = [(sign * float(top[0].diff) / num, bottom[i].mutable_dev_diff.reshape(num, -1))
                   for i, sign in ((0, 1.0), (1, -1.0)) if propagate_down[i]]
        if outputs:
            a, b = self._pairs(bottom)
            self.backend.contrastive_backward(self.state, a, b, p.margin, p.legacy_version,
                                              outputs)


@register("InfogainLoss")
class InfogainLossLayer(_LabelledLoss):
    """-sum_l H[label, l] log softmax(x)_l, with H from infogain_loss_param.source or a third
    bottom; the softmax runs along infogain_loss_param.axis. Second top: the probabilities."""
    device_ready = True
    exact_bottoms = None
    min_bottoms = 2
    max_bottoms = 3
    exact_tops = None
    min_tops = 1
    max_tops = 2

    def allow_force_backward(self, bottom_index):
        return bottom_index not in (1, 2)

    def setup(self, bottom, top):
        self._read_ignore_label()
        self.normalization = normalization_mode(self, allow_legacy=False)
        self.fixed_h = None
        if len(bottom) < 3:
            ip = self.param.infogain_loss_param
            if not ip.HasField("source"):
                raise self.error("Infogain matrix source must be specified "
                                 "(infogain_loss_param.source or a third bottom)")
            from ..io import read_blobproto, blobproto_to_array
            h = blobproto_to_array(read_blobproto(ip.source))
            self.fixed_h = self.backend.to_device(h)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.axis = bottom[0].canonical_axis_index(self.param.infogain_loss_param.axis)
        self.outer, self.channels, self.inner = split_at_axis(bottom[0].shape, self.axis)
        self._check_label_count(bottom, "infogain", self.axis)
        h_count = self.fixed_h.size if self.fixed_h is not None else bottom[2].count
        if h_count != self.channels * self.channels:
            raise self.error("H must be %d x %d (the number of labels along axis %d); it has "
                             "%d values" % (self.channels, self.channels, self.axis, h_count))
        if len(top) >= 2:
            top[1].reshape(bottom[0].shape)

    def _matrix(self, bottom):
        h = self.fixed_h if self.fixed_h is not None else bottom[2].dev_data
        return h.reshape(self.channels, self.channels)

    def _ignored(self):
        return self.ignore_label if self.has_ignore_label else None

    def forward(self, bottom, top):
        be = self.backend
        split = (self.outer, self.channels, self.inner)
        prob = be.softmax_forward(bottom[0].dev_data.reshape(split), be.empty(split))
        loss, count, self.state = be.infogain_forward(prob, bottom[1].dev_data,
                                                      self._matrix(bottom), self._ignored())
        if loss != loss:
            # NaN: a label out of range names itself here (else the net itself diverged)
            self._labels(bottom[1], self.outer, self.inner, self.channels)
        self.norm = normalizer(self.normalization, self.outer, self.inner, int(count))
        top[0].data[...] = loss / self.norm
        self.prob = prob
        if len(top) == 2:
            be.copy(prob, top[1].mutable_dev_data.reshape(split))

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs")
        if len(propagate_down) > 2 and propagate_down[2]:
            raise self.error("cannot backpropagate to infogain inputs")
        if not propagate_down[0]:
            return
        self.backend.infogain_backward(
            self.state, self.prob, bottom[1].dev_data, self._matrix(bottom), self._ignored(),
            float(top[0].diff) / self.norm, bottom[0].mutable_dev_diff.reshape(self.prob.shape))


@register("MultinomialLogisticLoss")
class MultinomialLogisticLossLayer(LossLayer):
    """-log(max(p[label], 1e-20)) averaged over num; bottom[0] already holds probabilities."""
    device_ready = True

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if bottom[1].count != bottom[1].shape[0]:
            raise self.error("the label bottom must be N x 1 x 1 x 1; got %s"
                             % (bottom[1].shape,))

    def _prob(self, bottom):
        return bottom[0].dev_data.reshape(bottom[0].shape[0], -1)

    def forward(self, bottom, top):
        prob = self._prob(bottom)
        loss = self.backend.multinomial_logistic_forward(prob, bottom[1].dev_data)
        if loss != loss:
            # NaN: a label out of range (read on the host only now), else the data's own NaN
            labels = bottom[1].data.reshape(-1).astype(np.int64)
            if bool(((labels < 0) | (labels >= prob.shape[1])).any()):
                raise self.error("labels must be integers in [0, %d)" % prob.shape[1])
        top[0].data[...] = loss / bottom[0].shape[0]

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs")
        if not propagate_down[0]:
            return
        prob = self._prob(bottom)
        self.backend.multinomial_logistic_backward(
            prob, bottom[1].dev_data, float(top[0].diff) / bottom[0].shape[0],
            bottom[0].mutable_dev_diff.reshape(prob.shape))


@register("SigmoidCrossEntropyLoss")
class SigmoidCrossEntropyLossLayer(_LabelledLoss):
    """Cross-entropy of sigmoid(x) against targets in [0, 1], computed stably from x;
    targets equal to loss_param.ignore_label are skipped. Without ``normalization`` or the
    legacy ``normalize``, divides by the batch size as Caffe 1.0 does."""
    device_ready = True

    def setup(self, bottom, top):
        self._read_ignore_label()
        self.normalization = normalization_mode(self, legacy_default=_Norm.BATCH_SIZE)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if bottom[0].count != bottom[1].count:
            raise self.error("SIGMOID_CROSS_ENTROPY_LOSS layer inputs must have the same "
                             "count: %s vs %s" % (bottom[0].shape, bottom[1].shape))
        self.outer = bottom[0].shape[0]
        self.inner = bottom[0].count_axes(1)

    def _ignored(self):
        return self.ignore_label if self.has_ignore_label else None

    def forward(self, bottom, top):
        loss, count, self.state = self.backend.sigmoid_cross_entropy_forward(
            bottom[0].dev_data, bottom[1].dev_data, self._ignored())
        self.norm = normalizer(self.normalization, self.outer, self.inner, count)
        top[0].data[...] = loss / self.norm

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs")
        if not propagate_down[0]:
            return
        self.backend.sigmoid_cross_entropy_backward(
            self.state, bottom[0].dev_data, bottom[1].dev_data, self._ignored(),
            float(top[0].diff) / self.norm, bottom[0].mutable_dev_diff)
