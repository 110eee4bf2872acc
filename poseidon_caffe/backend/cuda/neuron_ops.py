"""The neuron layers' named ops on the device (kernels/neuron.cu, kernels/prelu.cu); the CPU
backend's are in ../neuron_ops.py under the same names. Scalars a layer derives in double
(Power's power * scale, Log's scale * base_scale) are rounded to float once, as numpy does."""
import numpy as np


class NeuronOps:

    def prelu_forward(self, x, y, slopes, shared):
        channels, inner = (1, x.size) if shared else (x.shape[1], x.shape[2])
        self.kernels.prelu_forward(x.size, x.ptr, y.ptr, slopes.ptr, channels, max(inner, 1))

    def prelu_backward(self, x, dy, slopes, shared, dx=None, dslopes=None):
        if dslopes is not None:
            terms = self.empty(x.shape)
            self.kernels.prelu_slope_terms(x.size, dy.ptr, x.ptr, terms.ptr)
            per_channel = terms.reshape(1, 1, x.size) if shared else terms
            self.add_bias_grad(per_channel, dslopes.reshape(-1))
        if dx is not None:
            channels, inner = (1, x.size) if shared else (x.shape[1], x.shape[2])
            self.kernels.prelu_backward(x.size, dy.ptr, x.ptr, dx.ptr, slopes.ptr, channels,
                                        max(inner, 1))

    def elu_forward(self, x, y, alpha):
        self.kernels.elu_forward(x.size, x.ptr, y.ptr, float(alpha))

    def elu_backward(self, x, y, dy, dx, alpha):
        self.kernels.elu_backward(x.size, dy.ptr, x.ptr, y.ptr, dx.ptr, float(alpha))

    def sigmoid_forward(self, x, y):
        self.kernels.sigmoid_forward(x.size, x.ptr, y.ptr)

    def sigmoid_backward(self, y, dy, dx):
        self.kernels.sigmoid_backward(y.size, dy.ptr, y.ptr, dx.ptr)

    def tanh_forward(self, x, y):
        self.kernels.tanh_forward(x.size, x.ptr, y.ptr)

    def tanh_backward(self, y, dy, dx):
        self.kernels.tanh_backward(y.size, dy.ptr, y.ptr, dx.ptr)

    def abs_forward(self, x, y):
        self.kernels.abs_forward(x.size, x.ptr, y.ptr)

    def abs_backward(self, x, dy, dx):
        self.kernels.abs_backward(x.size, dy.ptr, x.ptr, dx.ptr)

    def bnll_forward(self, x, y):
        self.kernels.bnll_forward(x.size, x.ptr, y.ptr)

    def bnll_backward(self, x, dy, dx, exp_limit):
        # the kernel holds Caffe's limit (50) itself
        self.kernels.bnll_backward(x.size, dy.ptr, x.ptr, dx.ptr)

    def power_forward(self, x, y, power, scale, shift):
        self.kernels.power_forward(x.size, x.ptr, y.ptr, float(power), float(scale),
                                   float(shift))

    def power_backward(self, x, dy, dx, power, scale, shift):
        self.kernels.power_backward(x.size, dy.ptr, x.ptr, dx.ptr, float(power), float(scale),
                                    float(shift), float(np.float32(power * scale)))

    def exp_forward(self, x, y, inner_scale, outer_scale):
        self.kernels.exp_forward(x.size, x.ptr, y.ptr, float(inner_scale), float(outer_scale))

    def exp_backward(self, y, dy, dx, inner_scale):
        self.kernels.exp_backward(y.size, dy.ptr, y.ptr, dx.ptr, float(inner_scale))

    def log_forward(self, x, y, scale, shift, base_scale):
        self.kernels.log_forward(x.size, x.ptr, y.ptr, float(scale), float(shift),
                                 float(base_scale))

    def log_backward(self, x, dy, dx, scale, shift, base_scale):
        self.kernels.log_backward(x.size, dy.ptr, x.ptr, dx.ptr, float(scale), float(shift),
                                  float(np.float32(scale * base_scale)))

    def threshold_forward(self, x, y, threshold):
        self.kernels.threshold_forward(x.size, x.ptr, y.ptr, float(threshold))

    def clip_forward(self, x, y, lo, hi):
        self.kernels.clip_forward(x.size, x.ptr, y.ptr, float(lo), float(hi))

    def clip_backward(self, x, dy, dx, lo, hi):
        self.kernels.clip_backward(x.size, dy.ptr, x.ptr, dx.ptr, float(lo), float(hi))

    def swish_forward(self, x, y, beta):
        sigmoid = self.empty(x.shape)
        self.kernels.swish_forward(x.size, x.ptr, y.ptr, sigmoid.ptr, float(0.5 * beta))
        return sigmoid

    def swish_backward(self, y, sigmoid, dy, dx, beta):
        self.kernels.swish_backward(y.size, dy.ptr, y.ptr, sigmoid.ptr, dx.ptr, float(beta))
