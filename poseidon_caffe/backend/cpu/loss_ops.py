"""The named ops of the loss layers other than SoftmaxWithLoss, on the CPU: numpy over the
whole batch, the formulas the layers had inline (so results are unchanged). The CUDA backend
has the same names over kernels/loss.cu (cuda/loss_ops.py).

A forward returns the summed loss (a Python float; NaN when a label is out of range, for the
layer to name it) and, for losses with ignored labels, the count of items counted, with a
``state`` that only the same backend's backward reads. Backwards write the bottom gradient
scaled by ``scale`` (loss weight over the normaliser).
"""
import numpy as np

LOG_THRESHOLD = 1e-20                       # Caffe's kLOG_THRESHOLD
NAN = float("nan")


class LossOps:

    def subtract(self, a, b, out):
        """out = a - b, of one shape."""
        np.subtract(a, b, out=out)
        return out

    # -- HingeLoss -------------------------------------------------------------------------
    def hinge_forward(self, x, labels, l2):
        """x as (num, dim), one label per item: (sum of margins or of their squares, state)."""
        num, dim = x.shape
        labels = labels.reshape(-1).astype(np.int64)
        if bool(((labels < 0) | (labels >= dim)).any()):
            return NAN, None
        sign = -np.ones_like(x)
        sign[np.arange(num), labels] = 1.0
        margin = np.maximum(0.0, 1.0 - sign * x)
        if l2:
            loss = float((margin.astype(np.float64) ** 2).sum())
        else:
            loss = float(margin.sum(dtype=np.float64))
        return loss, (sign, margin)

    def hinge_backward(self, state, labels, l2, scale, dx):
        sign, margin = state
        grad = -2.0 * margin * sign if l2 else -np.sign(margin) * sign
        dx[...] = grad * scale

    # -- ContrastiveLoss -------------------------------------------------------------------
    def contrastive_forward(self, a, b, similar, margin, legacy):
        """a, b as (num, dim), one similarity per pair: (summed loss, state)."""
        num = a.shape[0]
        delta = a - b
        dist_sq = (delta.astype(np.float64) ** 2).sum(axis=1)
        similar = similar.reshape(num).astype(np.int64) != 0
        if legacy:
            dissimilar = np.maximum(margin - dist_sq, 0.0)
        else:
            dissimilar = np.maximum(margin - np.sqrt(dist_sq), 0.0) ** 2
        loss = np.where(similar, dist_sq, dissimilar).sum()
        return float(loss), (delta, dist_sq, similar)

    def contrastive_backward(self, state, a, b, margin, legacy, outputs):
        """outputs: (alpha, dx) pairs; each dx = alpha w (a - b), w per pair."""
        delta, dist_sq, similar = state
        if legacy:
            active = (margin - dist_sq) > 0
            dissimilar_scale = -1.0 * active
        else:
            dist = np.sqrt(dist_sq)
            mdist = margin - dist
            # Caffe's 1e-4 keeps the gradient finite at d = 0
            dissimilar_scale = np.where(mdist > 0, -mdist / (dist + 1e-4), 0.0)
        per_pair = np.where(similar, 1.0, dissimilar_scale)[:, None]
        for alpha, dx in outputs:
            dx[...] = alpha * per_pair * delta

    # -- InfogainLoss ----------------------------------------------------------------------
    def infogain_forward(self, prob, labels, h, ignore_label):
        """prob (outer, channels, inner), H (channels, channels): (summed loss, count,
        state)."""
        _, valid, safe, bad = self._label_positions(labels, prob.shape, ignore_label)
        if bad:
            return NAN, float(valid.sum()), None
        h_rows = h[safe]                                     # (outer, inner, channels)
        log_p = np.log(np.maximum(prob, LOG_THRESHOLD)).transpose(0, 2, 1)
        per_item = (h_rows.astype(np.float64) * log_p).sum(axis=2)
        return -float((per_item * valid).sum()), float(valid.sum()), (valid, safe)

    def infogain_backward(self, state, prob, labels, h, ignore_label, scale, dx):
        valid, safe = state
        h_rows = h[safe].transpose(0, 2, 1)                  # (outer, channels, inner)
        row_sums = h.sum(axis=1)[safe][:, None, :]
        grad = prob * row_sums - h_rows
        grad *= valid[:, None, :]
        grad *= scale
        dx[...] = grad

    # -- MultinomialLogisticLoss -----------------------------------------------------------
    @staticmethod
    def _picked(prob, labels):
        num = prob.shape[0]
        labels = labels.reshape(num).astype(np.int64)
        if bool(((labels < 0) | (labels >= prob.shape[1])).any()):
            return None
        rows = np.arange(num)
        return rows, labels, np.maximum(prob[rows, labels], LOG_THRESHOLD)

    def multinomial_logistic_forward(self, prob, labels):
        """prob as (num, dim), one label per item: the summed -log p(label)."""
        picked = self._picked(prob, labels)
        if picked is None:
            return NAN
        return -float(np.log(picked[2].astype(np.float64)).sum())

    def multinomial_logistic_backward(self, prob, labels, scale, dx):
        rows, labels, p = self._picked(prob, labels)
        grad = np.zeros_like(prob)
        grad[rows, labels] = -scale / p
        dx[...] = grad

    # -- SigmoidCrossEntropyLoss -----------------------------------------------------------
    def sigmoid_cross_entropy_forward(self, x, target, ignore_label):
        """x, targets flat: (summed loss, count, state)."""
        x = x.reshape(-1).astype(np.float64)
        target = target.reshape(-1)
        valid = np.ones(x.shape, dtype=bool)
        if ignore_label is not None:
            valid = target.astype(np.int64) != ignore_label
        positive = (x >= 0).astype(np.float64)
        # -[t log s(x) + (1 - t) log(1 - s(x))], rewritten so exp never overflows
        loss = -(x * (target - positive) - np.log1p(np.exp(x - 2.0 * x * positive)))
        return float((loss * valid).sum()), int(valid.sum()), valid

    def sigmoid_cross_entropy_backward(self, state, x, target, ignore_label, scale, dx):
        x = x.reshape(-1)
        sigmoid = 0.5 * (1.0 + np.tanh(0.5 * x))      # no overflow for large |x|
        grad = (sigmoid - target.reshape(-1)) * state
        grad *= scale
        dx[...] = grad.reshape(dx.shape)
