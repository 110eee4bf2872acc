"""MVN's named ops on the CPU: the layer's numpy over whole arrays, as it had them inline (so
results are unchanged). The CUDA backend has the same names over kernels/mvn.cu
(cuda/mvn_ops.py). Arrays are (rows, dim): one row per normalised set."""
import numpy as np


class MVNOps:

    def mvn_forward(self, x, normalize_variance, eps, y):
        """y = x minus its row mean, divided by the row's std + eps with normalize_variance;
        returns that std (rows, 1) for the backward, or None."""
        centred = x - x.mean(axis=1, keepdims=True, dtype=np.float64).astype(x.dtype)
        std = None
        if normalize_variance:
            variance = np.square(centred).mean(axis=1, keepdims=True, dtype=np.float64)
            # Caffe adds eps to the standard deviation, not to the variance
            std = (np.sqrt(variance) + eps).astype(x.dtype)
            centred = centred / std
        y[...] = centred
        return std

    def mvn_backward(self, dy, y, std, dx):
        """dx from the top gradient dy, the top y and the forward's std (None: mean only)."""
        grad = dy - dy.mean(axis=1, keepdims=True)
        if std is not None:
            grad = (grad - y * (dy * y).mean(axis=1, keepdims=True)) / std
        dx[...] = grad
