"""The loss layers' named ops on the device (kernels/loss.cu); the CPU backend's are in
cpu/loss_ops.py under the same names. Per-item losses and counts stay on the device and are
summed there; only the two sums come back."""
from . import kernels


def _ignore(ignore_label):
    return int(ignore_label is not None), int(ignore_label or 0)


class LossOps:

    def subtract(self, a, b, out):
        self._same_size(a, out, "subtract")
        self._same_size(b, out, "subtract")
        if out.size:
            self.launcher.run(kernels.math.vec_sub, out.size, a.ptr, b.ptr, out.ptr)
        return out

    def hinge_forward(self, x, labels, l2):
        num, dim = x.shape
        margin = self.empty(x.shape)
        self.launcher.run(kernels.loss.hinge_forward, x.size, x.ptr, labels.ptr, dim, margin.ptr)
        return (self.sumsq(margin) if l2 else self.sum(margin)), margin

    def hinge_backward(self, state, labels, l2, scale, dx):
        self.launcher.run(kernels.loss.hinge_backward, dx.size, state.ptr, labels.ptr, dx.shape[1],
                          int(l2), float(scale), dx.ptr)

    def contrastive_forward(self, a, b, similar, margin, legacy):
        num, dim = a.shape
        dist_sq, loss = self.empty((num,)), self.empty((num,))
        self.launcher.run(kernels.loss.contrastive_forward, num, a.ptr, b.ptr, similar.ptr, dim,
                          float(margin), int(legacy), dist_sq.ptr, loss.ptr)
        return self.sum(loss), (similar, dist_sq)

    def contrastive_backward(self, state, a, b, margin, legacy, outputs):
        similar, dist_sq = state
        for alpha, dx in outputs:
            self.launcher.run(kernels.loss.contrastive_backward, dx.size, a.ptr, b.ptr,
                              similar.ptr, dist_sq.ptr, a.shape[1], float(margin), int(legacy),
                              float(alpha), dx.ptr)

    def infogain_forward(self, prob, labels, h, ignore_label):
        outer, channels, inner = prob.shape
        n = outer * inner
        loss, counts = self.empty((n,)), self.empty((n,))
        self.launcher.run(kernels.loss.infogain_forward, n, prob.ptr, labels.ptr, h.ptr, channels,
                          inner, *_ignore(ignore_label), loss.ptr, counts.ptr)
        return self.sum(loss), self.sum(counts), None

    def infogain_backward(self, state, prob, labels, h, ignore_label, scale, dx):
        outer, channels, inner = prob.shape
        self.launcher.run(kernels.loss.infogain_backward, prob.size, prob.ptr, labels.ptr, h.ptr,
                          channels, inner, *_ignore(ignore_label), float(scale), dx.ptr)

    def multinomial_logistic_forward(self, prob, labels):
        num, dim = prob.shape
        loss = self.empty((num,))
        self.launcher.run(kernels.loss.multinomial_logistic_forward, num, prob.ptr, labels.ptr,
                          dim, loss.ptr)
        return self.sum(loss)

    def multinomial_logistic_backward(self, prob, labels, scale, dx):
        self.launcher.run(kernels.loss.multinomial_logistic_backward, prob.size, prob.ptr,
                          labels.ptr, prob.shape[1], float(scale), dx.ptr)

    def sigmoid_cross_entropy_forward(self, x, target, ignore_label):
        loss, counts = self.empty((x.size,)), self.empty((x.size,))
        self.launcher.run(kernels.loss.sigmoid_cross_entropy_forward, x.size, x.ptr, target.ptr,
                          *_ignore(ignore_label), loss.ptr, counts.ptr)
        return self.sum(loss), int(round(self.sum(counts))), None

    def sigmoid_cross_entropy_backward(self, state, x, target, ignore_label, scale, dx):
        self.launcher.run(kernels.loss.sigmoid_cross_entropy_backward, x.size, x.ptr, target.ptr,
                          *_ignore(ignore_label), float(scale), dx.ptr)
