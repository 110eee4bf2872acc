"""Layer family: loss layers, Softmax and Accuracy, with Caffe's normalisation rules.

Every loss writes a scalar into ``top[0]`` (a 0-axis blob). Backward scales by ``top[0].diff``,
which the net seeds with the loss weight.
"""
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
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    return outer, shape[axis], inner


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
        """Integer labels (outer, inner), a validity mask, and labels safe to index with."""
        xp = self.xp
        labels = label_blob.data.reshape(outer, inner).astype(np.int64)
        valid = xp.ones(labels.shape, dtype=bool)
        if self.has_ignore_label:
            valid = labels != self.ignore_label
        bad = valid & ((labels < 0) | (labels >= channels))
        if bool(bad.any()):
            raise self.error("label %d is out of range: labels must be integers in [0, %d)"
                             % (int(labels[bad].ravel()[0]), channels))
        return labels, valid, xp.where(valid, labels, 0)

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
        loss, count = be.softmax_loss_forward(prob, bottom[1].dev_data, self._ignored())
        if loss != loss:
            # NaN: a label out of range names itself here (else the net itself diverged)
            self._labels(bottom[1], self.outer, self.inner, self.channels)
        self.norm = normalizer(self.normalization, self.outer, self.inner, int(count))
        top[0].data[...] = loss / self.norm
        self.prob = prob
        if len(top) == 2:
            be.copy(prob, top[1].mutable_dev_data.reshape(split))

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

    def forward(self, bottom, top):
        be = self.backend
        a = bottom[0].dev_data
        self.delta = be.axpby(-1.0, bottom[1].dev_data.reshape(a.shape), 1.0,
                              be.copy(a, be.empty(a.shape)))
        top[0].data[...] = be.sumsq(self.delta) / bottom[0].shape[0] / 2.0

    def backward(self, top, propagate_down, bottom):
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                alpha = sign * float(top[0].diff) / bottom[i].shape[0]
                self.backend.scale(alpha, self.delta,
                                   bottom[i].mutable_dev_diff.reshape(self.delta.shape))


@register("HingeLoss")
class HingeLossLayer(LossLayer):
    """One-vs-all hinge: t = max(0, 1 - y_k x_k) with y = +1 for the label, -1 otherwise;
    L1 sums t, L2 sums t^2, both divided by num."""

    def forward(self, bottom, top):
        xp = self.xp
        num = bottom[0].shape[0]
        x = bottom[0].data.reshape(num, -1)
        labels = bottom[1].data.reshape(-1).astype(np.int64)
        if labels.size != num or bool(((labels < 0) | (labels >= x.shape[1])).any()):
            raise self.error("needs one label per item in [0, %d); got labels %s"
                             % (x.shape[1], bottom[1].shape))
        sign = -xp.ones_like(x)
        sign[xp.arange(num), labels] = 1.0
        self.sign = sign
        self.margin = xp.maximum(0.0, 1.0 - sign * x)
        if self.param.hinge_loss_param.norm == caffe_pb2.HingeLossParameter.L2:
            loss = float((self.margin.astype(np.float64) ** 2).sum())
        else:
            loss = float(self.margin.sum(dtype=np.float64))
        top[0].data[...] = loss / num

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs")
        if not propagate_down[0]:
            return
        num = bottom[0].shape[0]
        if self.param.hinge_loss_param.norm == caffe_pb2.HingeLossParameter.L2:
            grad = -2.0 * self.margin * self.sign
        else:
            grad = -self.xp.sign(self.margin) * self.sign
        bottom[0].diff[...] = (grad * (float(top[0].diff) / num)).reshape(bottom[0].shape)


@register("ContrastiveLoss")
class ContrastiveLossLayer(LossLayer):
    """Pairs (a, b) with similarity y: y d^2 + (1 - y) max(margin - d, 0)^2, over 2 num
    (legacy_version: (1 - y) max(margin - d^2, 0))."""
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

    def forward(self, bottom, top):
        xp = self.xp
        p = self.param.contrastive_loss_param
        num = bottom[0].shape[0]
        self.delta = (bottom[0].data - bottom[1].data).reshape(num, -1)
        self.dist_sq = (self.delta.astype(np.float64) ** 2).sum(axis=1)
        self.similar = bottom[2].data.reshape(num).astype(np.int64) != 0
        if p.legacy_version:
            dissimilar = xp.maximum(p.margin - self.dist_sq, 0.0)
        else:
            dissimilar = xp.maximum(p.margin - xp.sqrt(self.dist_sq), 0.0) ** 2
        loss = xp.where(self.similar, self.dist_sq, dissimilar).sum()
        top[0].data[...] = float(loss) / num / 2.0

    def backward(self, top, propagate_down, bottom):
        xp = self.xp
        p = self.param.contrastive_loss_param
        num = bottom[0].shape[0]
        if p.legacy_version:
            active = (p.margin - self.dist_sq) > 0
            dissimilar_scale = -1.0 * active
        else:
            dist = xp.sqrt(self.dist_sq)
            mdist = p.margin - dist
            # Caffe's 1e-4 keeps the gradient finite at d = 0
            dissimilar_scale = xp.where(mdist > 0, -mdist / (dist + 1e-4), 0.0)
        per_pair = xp.where(self.similar, 1.0, dissimilar_scale)[:, None]
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                alpha = sign * float(top[0].diff) / num
                bottom[i].diff[...] = (alpha * per_pair * self.delta).reshape(bottom[i].shape)


@register("InfogainLoss")
class InfogainLossLayer(_LabelledLoss):
    """-sum_l H[label, l] log softmax(x)_l, with H from infogain_loss_param.source or a third
    bottom; the softmax runs along infogain_loss_param.axis. Second top: the probabilities."""
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
        h = self.fixed_h if self.fixed_h is not None else bottom[2].data
        return h.reshape(self.channels, self.channels)

    def forward(self, bottom, top):
        xp = self.xp
        split = (self.outer, self.channels, self.inner)
        prob = softmax_along(xp, bottom[0].data.reshape(split))
        labels, valid, safe = self._labels(bottom[1], self.outer, self.inner, self.channels)
        h_rows = self._matrix(bottom)[safe]                  # (outer, inner, channels)
        log_p = xp.log(xp.maximum(prob, LOG_THRESHOLD)).transpose(0, 2, 1)
        per_item = (h_rows.astype(np.float64) * log_p).sum(axis=2)
        count = int(valid.sum())
        self.norm = normalizer(self.normalization, self.outer, self.inner, count)
        top[0].data[...] = -float((per_item * valid).sum()) / self.norm
        self.prob, self.valid, self.safe_labels = prob, valid, safe
        if len(top) == 2:
            top[1].data[...] = prob.reshape(top[1].shape)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs")
        if len(propagate_down) > 2 and propagate_down[2]:
            raise self.error("cannot backpropagate to infogain inputs")
        if not propagate_down[0]:
            return
        h = self._matrix(bottom)
        h_rows = h[self.safe_labels].transpose(0, 2, 1)      # (outer, channels, inner)
        row_sums = h.sum(axis=1)[self.safe_labels][:, None, :]
        grad = self.prob * row_sums - h_rows
        grad *= self.valid[:, None, :]
        grad *= float(top[0].diff) / self.norm
        bottom[0].diff[...] = grad.reshape(bottom[0].shape)


@register("MultinomialLogisticLoss")
class MultinomialLogisticLossLayer(LossLayer):
    """-log(max(p[label], 1e-20)) averaged over num; bottom[0] already holds probabilities."""

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if bottom[1].count != bottom[1].shape[0]:
            raise self.error("the label bottom must be N x 1 x 1 x 1; got %s"
                             % (bottom[1].shape,))

    def _picked(self, bottom):
        num = bottom[0].shape[0]
        prob = bottom[0].data.reshape(num, -1)
        labels = bottom[1].data.reshape(num).astype(np.int64)
        if bool(((labels < 0) | (labels >= prob.shape[1])).any()):
            raise self.error("labels must be integers in [0, %d)" % prob.shape[1])
        rows = self.xp.arange(num)
        return prob, rows, labels, self.xp.maximum(prob[rows, labels], LOG_THRESHOLD)

    def forward(self, bottom, top):
        _, _, _, p = self._picked(bottom)
        top[0].data[...] = -float(self.xp.log(p.astype(np.float64)).sum()) / bottom[0].shape[0]

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs")
        if not propagate_down[0]:
            return
        prob, rows, labels, p = self._picked(bottom)
        grad = self.xp.zeros_like(prob)
        grad[rows, labels] = -(float(top[0].diff) / bottom[0].shape[0]) / p
        bottom[0].diff[...] = grad.reshape(bottom[0].shape)


@register("SigmoidCrossEntropyLoss")
class SigmoidCrossEntropyLossLayer(_LabelledLoss):
    """Cross-entropy of sigmoid(x) against targets in [0, 1], computed stably from x;
    targets equal to loss_param.ignore_label are skipped. Without ``normalization`` or the
    legacy ``normalize``, divides by the batch size as Caffe 1.0 does."""

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

    def forward(self, bottom, top):
        xp = self.xp
        x = bottom[0].data.reshape(-1).astype(np.float64)
        target = bottom[1].data.reshape(-1)
        valid = xp.ones(x.shape, dtype=bool)
        if self.has_ignore_label:
            valid = target.astype(np.int64) != self.ignore_label
        positive = (x >= 0).astype(np.float64)
        # -[t log s(x) + (1 - t) log(1 - s(x))], rewritten so exp never overflows
        loss = -(x * (target - positive) - xp.log1p(xp.exp(x - 2.0 * x * positive)))
        count = int(valid.sum())
        self.norm = normalizer(self.normalization, self.outer, self.inner, count)
        self.valid = valid
        top[0].data[...] = float((loss * valid).sum()) / self.norm

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs")
        if not propagate_down[0]:
            return
        xp = self.xp
        x = bottom[0].data.reshape(-1)
        sigmoid = 0.5 * (1.0 + xp.tanh(0.5 * x))      # no overflow for large |x|
        grad = (sigmoid - bottom[1].data.reshape(-1)) * self.valid
        grad *= float(top[0].diff) / self.norm
        bottom[0].diff[...] = grad.reshape(bottom[0].shape)
