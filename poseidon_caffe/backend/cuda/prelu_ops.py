"""PReLU's named ops on the device (kernels/prelu.cu); the CPU backend's are in
cpu/prelu_ops.py under the same names. The slopes' gradient is summed by BLAS (add_bias_grad)
from per-element terms, so no kernel reduces."""
from . import kernels


class PReLUOps:

    def prelu_forward(self, x, y, slopes, shared):
        channels, inner = (1, x.size) if shared else (x.shape[1], x.shape[2])
        self.launcher.run(kernels.prelu.prelu_forward, x.size, x.ptr, y.ptr, slopes.ptr, channels,
                          max(inner, 1))

    def prelu_backward(self, x, dy, slopes, shared, dx=None, dslopes=None):
        if dslopes is not None:
            terms = self.empty(x.shape)
            self.launcher.run(kernels.prelu.prelu_slope_terms, x.size, dy.ptr, x.ptr, terms.ptr)
            per_channel = terms.reshape(1, 1, x.size) if shared else terms
            self.add_bias_grad(per_channel, dslopes.reshape(-1))
        if dx is not None:
            channels, inner = (1, x.size) if shared else (x.shape[1], x.shape[2])
            self.launcher.run(kernels.prelu.prelu_backward, x.size, dy.ptr, x.ptr, dx.ptr,
                              slopes.ptr, channels, max(inner, 1))
