"""MVN's named ops on the device (kernels/mvn.cu); the CPU backend's are in cpu/mvn_ops.py
under the same names. Arrays are (rows, dim); the row statistics are small device arrays."""
from . import kernels


class MVNOps:

    def mvn_forward(self, x, normalize_variance, eps, y):
        rows, dim = x.shape
        mean = self.empty((rows, 1))
        std = self.empty((rows, 1)) if normalize_variance else None
        self.launcher.run(kernels.mvn.mvn_row_stats, rows, x.ptr, dim,
                          int(bool(normalize_variance)), float(eps), mean.ptr,
                          None if std is None else std.ptr)
        self.launcher.run(kernels.mvn.mvn_normalize, x.size, x.ptr, mean.ptr,
                          None if std is None else std.ptr, dim, y.ptr)
        return std

    def mvn_backward(self, dy, y, std, dx):
        rows, dim = dy.shape
        mean_dy = self.empty((rows, 1))
        mean_dy_y = self.empty((rows, 1)) if std is not None else None
        self.launcher.run(kernels.mvn.mvn_row_grads, rows, dy.ptr, None if std is None else y.ptr,
                          dim, mean_dy.ptr, None if std is None else mean_dy_y.ptr)
        self.launcher.run(kernels.mvn.mvn_backward, dy.size, dy.ptr,
                          None if std is None else y.ptr, mean_dy.ptr,
                          None if std is None else mean_dy_y.ptr, None if std is None else std.ptr,
                          dim, dx.ptr)
