"""CUDABackend: the op set of backend/ops.py on one device, over the driver interface.

Arrays are ``DeviceArray``s: a shape, float32 (or int32), a device pointer and the object
that owns the memory (an ``Allocation``, or the SyncedMemory of a blob), so a reshape or a
slice along the first axis is a new view on the same memory. There is no implicit copy to the
host: ``to_host`` is the one way back, and numpy cannot read a DeviceArray by accident.

Heavy work is cuBLAS (row-major Caffe shapes mapped onto column-major calls: a row-major
C = A B is the column-major C^T = B^T A^T) and the kernels of ``kernels/``; light work is the
named ops below, which the CPU backend implements with numpy under the same names.
"""
import math
import weakref

import numpy as np

from .. import dropout_bits
from ..geometry import PoolGeometry
from ..ops import Backend
from .block_cache import LIMIT, BlockCache
from .choice import driver_kind
from .choice import open_driver
from .driver import DriverError
from . import kernels
from .launch import KernelSet
from .common_ops import CommonOps
from .loss_ops import LossOps
from .prelu_ops import PReLUOps
from .mvn_ops import MVNOps
from .recurrent_ops import RecurrentOps
from .synced import SyncedMemory

F32 = np.dtype(np.float32)
I32 = np.dtype(np.int32)


class DeviceMemoryError(MemoryError):
    """Device memory that cannot be had: says how many bytes were asked and what was free."""


class _SyncedMemory(SyncedMemory):
    """SyncedMemory whose device side, when it cannot be had, says so as DeviceMemoryError."""

    def _device_ptr(self):
        try:
            return super()._device_ptr()
        except DriverError as exc:
            free, total = self.driver.mem_info()
            raise DeviceMemoryError("out of device memory: %d bytes asked, %d of %d free (%s)"
                                    % (self.nbytes, free, total, exc)) from None


class Allocation:
    """Device memory given back (to the backend's BlockCache) when the last array viewing it
    goes."""

    def __init__(self, cache, nbytes):
        self.nbytes = int(nbytes)
        size = max(self.nbytes, 4)
        try:
            self.ptr = cache.alloc(size)
        except DriverError as exc:
            free, total = cache.driver.mem_info()
            raise DeviceMemoryError("out of device memory: %d bytes asked, %d of %d free (%s)"
                                    % (self.nbytes, free, total, exc)) from None
        weakref.finalize(self, cache.free, self.ptr, size)


class DeviceArray:
    """A C-contiguous array in device memory: ``shape``, ``dtype``, ``ptr``, ``owner``."""
    __slots__ = ("shape", "dtype", "ptr", "owner", "__weakref__")

    def __init__(self, shape, ptr, owner, dtype=F32):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.ptr = int(ptr)
        self.owner = owner

    size = property(lambda self: math.prod(self.shape))
    ndim = property(lambda self: len(self.shape))
    nbytes = property(lambda self: self.size * self.dtype.itemsize)

    def __len__(self):
        return self.shape[0]

    def reshape(self, *shape):
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        shape = list(int(s) for s in shape)
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = self.size // known if known else 0
        if math.prod(shape) != self.size:
            raise ValueError("cannot reshape a device array of shape %s into %s"
                             % (self.shape, tuple(shape)))
        return DeviceArray(shape, self.ptr, self.owner, self.dtype)

    def ravel(self):
        return self.reshape(self.size)

    def rows(self, start, stop):
        """The view of rows start..stop of the first axis (contiguous)."""
        row = math.prod(self.shape[1:]) * self.dtype.itemsize
        return DeviceArray((stop - start,) + self.shape[1:], self.ptr + start * row,
                           self.owner, self.dtype)

    def __array__(self, *args, **kwargs):
        raise TypeError("a device array is not host memory: use the backend's to_host()")

    def __repr__(self):
        return "<DeviceArray %s %s at 0x%x>" % (self.shape, self.dtype.name, self.ptr)


class _NoArrayNamespace:
    """The device has no numpy-like namespace: layers use the backend's named ops."""

    def __getattr__(self, name):
        raise AttributeError("the CUDA backend has no array namespace (xp.%s): use the "
                             "backend's named ops" % name)


class CUDABackend(PReLUOps, LossOps, CommonOps, RecurrentOps, MVNOps, Backend):
    """The op set of backend/ops.py on one device, over a driver."""
    name = "cuda"
    xp = _NoArrayNamespace()
    on_device = True

    def __init__(self, device=0, kind=None, driver=None):
        self.driver = driver or open_driver(kind or driver_kind(), device)
        self.device = int(device)
        self.launcher = KernelSet(self.driver)
        self.blas = self.driver.blas()
        # the emulated device keeps none, so a pointer used after its array went still
        # faults there (the cache's own tests give it a limit)
        self.blocks = BlockCache(self.driver, limit=0 if self.driver.info.emulated else LIMIT)
        self._ones = None

    @property
    def emulated(self):
        return self.driver.info.emulated

    def synchronize(self):
        self.driver.synchronize()

    # -- the host side: pinned buffers, streams, events, asynchronous copies ---------------
    def pinned_empty(self, shape, dtype=np.float32):
        return self.driver.pinned_empty(shape, dtype)

    def stream(self, non_blocking=False):
        return self.driver.stream(non_blocking)

    def event(self):
        return self.driver.event()

    def copy_to_host(self, dst, src, stream=None):
        self._same_size(dst, src, "copy_to_host")
        self.driver.copy_dtoh(dst, src.ptr, stream)

    def enter_thread(self):
        self.driver.make_current()

    def leave_thread(self):
        self.driver.release_current()

    def transfers_now(self):
        return self.driver.transfers_now()

    # -- memory ----------------------------------------------------------------------------
    def empty(self, shape, dtype=None):
        shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        dtype = np.dtype(dtype or F32)
        owner = Allocation(self.blocks, math.prod(shape) * dtype.itemsize)
        return DeviceArray(shape, owner.ptr, owner, dtype)

    def zeros(self, shape, dtype=None):
        a = self.empty(shape, dtype)
        self.driver.memset(a.ptr, 0, a.nbytes)
        return a

    def to_device(self, array, dtype=None):
        if isinstance(array, DeviceArray):
            return array
        host = np.ascontiguousarray(array, dtype=dtype or F32)
        a = self.empty(host.shape, host.dtype)
        self.driver.copy_htod(a.ptr, host)
        return a

    def to_host(self, array):
        if not isinstance(array, DeviceArray):
            return np.asarray(array)
        out = np.empty(array.shape, array.dtype)
        self.driver.copy_dtoh(out, array.ptr)
        return out

    def upload(self, host, out):
        """Device array ``out`` <- the host array ``host`` (same size)."""
        host = np.ascontiguousarray(host, dtype=out.dtype)
        self._same_size(host, out, "upload")
        self.driver.copy_htod(out.ptr, host)
        return out

    def batch_ring(self, depth):
        """The slots a prefetch thread uploads batches through (batch_ring.py)."""
        from .batch_ring import DeviceBatchRing
        return DeviceBatchRing(self, depth)

    def synced_memory(self, count):
        """Caffe's SyncedMemory of ``count`` floats on this device (a blob's data or diff)."""
        return _SyncedMemory(self.driver, count, F32)

    def view(self, ptr, shape, owner):
        return DeviceArray(shape, ptr, owner)

    @staticmethod
    def _same_size(a, b, what):
        if a.size != b.size:
            raise ValueError("%s: %s values into %s" % (what, a.shape, b.shape))

    # -- light work (the named ops; cpu/backend.py has the same names) ---------------------
    def fill(self, out, value):
        if out.size:
            self.launcher.run(kernels.math.vec_set, out.size, out.ptr, float(value))
        return out

    def copy(self, src, out):
        self._same_size(src, out, "copy")
        self.driver.copy_dtod(out.ptr, src.ptr, out.nbytes)
        return out

    def axpby(self, alpha, x, beta, y):
        """y = alpha x + beta y."""
        self._same_size(x, y, "axpby")
        if y.size:
            self.launcher.run(kernels.math.vec_axpby, y.size, float(alpha), x.ptr, float(beta),
                              y.ptr)
        return y

    def scale(self, alpha, x, out=None):
        out = x if out is None else out
        if x.size:
            self.launcher.run(kernels.math.vec_scale, x.size, float(alpha), x.ptr, out.ptr)
        return out

    def sum(self, x):
        """The sum of x as a Python float (a value read back to the host)."""
        ones = self._ones_of(x.size)
        return float(self.blas.sdot(x.size, x.ptr, 1, ones.ptr, 1)) if x.size else 0.0

    def sum_into(self, x, out, squares=False):
        """out (one value on the device) = the sum of x, or of its squares: a loss that stays
        on the device (sgemv writes its result to device memory; sdot would return it to the
        host and wait)."""
        if not x.size:
            return self.fill(out, 0.0)
        other = x if squares else self._ones_of(x.size)
        # column-major x as an n x 1 matrix, transposed, times a vector of n values
        self.blas.sgemv("T", x.size, 1, 1.0, x.ptr, x.size, other.ptr, 1, 0.0, out.ptr, 1)
        return out

    def divide(self, x, divisor, out):
        """out = x / divisor (a host float), rounded as one float division."""
        self._same_size(x, out, "divide")
        if out.size:
            self.launcher.run(kernels.math.vec_div_scalar, out.size, x.ptr, float(divisor), out.ptr)
        return out

    def _ones_of(self, count):
        if self._ones is None or self._ones.size < count:
            self._ones = self.empty(max(int(count), 1024))
            self.fill(self._ones, 1.0)
        return self._ones

    def add_bias(self, y, bias):
        """y (outer, channels, inner) += bias (channels) broadcast over outer and inner."""
        outer, channels, inner = y.shape
        ones = self._ones_of(inner)
        # per outer slice: y_o (channels, inner) += bias (channels, 1) ones (1, inner)
        self.blas.sgemm_strided_batched("N", "N", inner, channels, 1, 1.0, ones.ptr, inner, 0,
                                        bias.ptr, 1, 0, 1.0, y.ptr, inner, channels * inner,
                                        outer)
        return y

    def add_bias_grad(self, dy, dbias):
        """dbias (channels) += dy (outer, channels, inner) summed over outer and inner."""
        outer, channels, inner = dy.shape
        ones = self._ones_of(max(outer, inner))
        if inner == 1:
            self.blas.sgemv("N", channels, outer, 1.0, dy.ptr, channels, ones.ptr, 1, 1.0,
                            dbias.ptr, 1)
            return dbias
        per_position = self.empty((channels * inner,))
        self.blas.sgemv("N", channels * inner, outer, 1.0, dy.ptr, channels * inner, ones.ptr,
                        1, 0.0, per_position.ptr, 1)
        self.blas.sgemv("T", inner, channels, 1.0, per_position.ptr, inner, ones.ptr, 1, 1.0,
                        dbias.ptr, 1)
        return dbias

    def relu_forward(self, x, y, slope):
        self.launcher.run(kernels.neuron.relu_forward, x.size, x.ptr, y.ptr, float(slope))

    def relu_backward(self, x, dy, dx, slope):
        self.launcher.run(kernels.neuron.relu_backward, x.size, dy.ptr, x.ptr, dx.ptr, float(slope))

    def neuron_forward(self, kind, x, y, *params):
        """The neuron map ``kind`` (kernels/neuron.cu, cpu/neuron.py's names)."""
        if kind == "swish":
            sigmoid = self.empty(x.shape)
            self.launcher.run(kernels.neuron.swish_forward, x.size, x.ptr, y.ptr, sigmoid.ptr,
                              float(params[0]))
            return sigmoid
        self.launcher.run(getattr(kernels.neuron, kind + "_forward"), x.size, x.ptr, y.ptr,
                          *(float(p) for p in params))
        return None

    def neuron_backward(self, kind, dy, *arrays_and_params):
        count = (2 if kind in ("elu", "swish") else 1) + 1
        arrays, params = arrays_and_params[:count], arrays_and_params[count:]
        self.launcher.run(getattr(kernels.neuron, kind + "_backward"), dy.size, dy.ptr,
                          *(a.ptr for a in arrays), *(float(p) for p in params))
        return arrays[-1]

    def axis_copy(self, part, whole, axis, offset, to_whole):
        if not part.size:
            return
        inner = math.prod(part.shape[axis + 1:])
        if to_whole:
            self.launcher.run(kernels.copy.concat, part.size, part.ptr, 1, inner,
                              whole.shape[axis], part.shape[axis], offset, whole.ptr)
        else:
            self.launcher.run(kernels.copy.concat, part.size, whole.ptr, 0, inner,
                              whole.shape[axis], part.shape[axis], offset, part.ptr)

    def eltwise_forward(self, op, xs, coeffs, y):
        k, n = self.launcher, y.size
        if op == "prod":
            k.run(kernels.math.vec_mul, n, xs[0].ptr, xs[1].ptr, y.ptr)
            for x in xs[2:]:
                k.run(kernels.math.vec_mul, n, y.ptr, x.ptr, y.ptr)
        elif op == "sum":
            self.scale(coeffs[0], xs[0], y)
            for c, x in zip(coeffs[1:], xs[1:]):
                self.axpby(c, x, 1.0, y)
        else:
            argmax = self.empty(y.shape, I32)
            k.run(kernels.eltwise.eltwise_max_forward, n, xs[0].ptr, xs[1].ptr, 1, y.ptr,
                  argmax.ptr)
            for i, x in enumerate(xs[2:], 2):
                k.run(kernels.eltwise.eltwise_max_forward, n, y.ptr, x.ptr, i, y.ptr, argmax.ptr)
            return argmax
        return None

    def eltwise_backward(self, op, i, xs, y, dy, dx, coeffs, argmax, stable_prod_grad):
        k, n = self.launcher, dy.size
        if op == "prod":
            if stable_prod_grad:
                others = [x for j, x in enumerate(xs) if j != i]
                self.copy(others[0], dx)
                for x in others[1:]:
                    k.run(kernels.math.vec_mul, n, dx.ptr, x.ptr, dx.ptr)
            else:
                k.run(kernels.math.vec_div, n, y.ptr, xs[i].ptr, dx.ptr)
            k.run(kernels.math.vec_mul, n, dx.ptr, dy.ptr, dx.ptr)
        elif op == "sum":
            self.scale(coeffs[i], dy, dx)
        else:
            k.run(kernels.eltwise.eltwise_max_backward, n, dy.ptr, argmax.ptr, i, dx.ptr)

    def crop_copy(self, big, small, offsets, to_small):
        if not small.size:
            return
        def strides(shape):
            return [math.prod(shape[a + 1:]) for a in range(len(shape))]
        geometry = self.to_device(np.asarray(strides(big.shape) + strides(small.shape) +
                                             list(offsets), np.int32), dtype=np.int32)
        if to_small:
            self.launcher.run(kernels.copy.crop_copy, small.size, small.ndim, geometry.ptr,
                              big.ptr, small.ptr, 1)
        else:
            self.launcher.run(kernels.copy.crop_copy, small.size, small.ndim, geometry.ptr,
                              small.ptr, big.ptr, 0)

    def tile_forward(self, x, y):
        """y (outer, tiles, inner) = x (outer, 1, inner) repeated."""
        outer, tiles, inner = y.shape
        if y.size:
            self.launcher.run(kernels.copy.tile_forward, y.size, x.ptr, inner, tiles, y.ptr)

    def tile_backward(self, dy, dx):
        """dx (outer, 1, inner) = dy (outer, tiles, inner) summed over the tiles."""
        outer, tiles, inner = dy.shape
        if dx.size:
            self.launcher.run(kernels.copy.tile_backward, dx.size, dy.ptr, inner, tiles, dx.ptr)

    # -- Embed (kernels/embed.cu) ---------------------------------------------------------
    def embed_forward(self, indices, index_values, weight, y):
        input_dim, num_output = weight.shape
        if y.size:
            self.launcher.run(kernels.embed.embed_forward, y.size, index_values.ptr, weight.ptr,
                              input_dim, num_output, None, y.ptr)

    def embed_backward(self, indices, index_values, dy, weight_diff):
        input_dim, num_output = weight_diff.shape
        self.launcher.run(kernels.embed.embed_backward, weight_diff.size, index_values.ptr, dy.ptr,
                          dy.shape[0], num_output, weight_diff.ptr)

    # -- Scale and Bias over (outer, dim, inner) ------------------------------------------
    def scale_forward(self, x, scale, bias, y):
        outer, dim, inner = x.shape
        if x.size:
            self.launcher.run(kernels.math.channel_scale, x.size, x.ptr, scale.ptr,
                              None if bias is None else bias.ptr, dim, inner, y.ptr)

    def scale_backward(self, x, scale, dy, dx):
        self.scale_forward(dy, scale, None, dx)

    def broadcast_grad(self, dy, grad, accumulate, x=None):
        if x is not None:
            product = self.empty(dy.shape)
            self.launcher.run(kernels.math.vec_mul, dy.size, dy.ptr, x.ptr, product.ptr)
            dy = product
        if not accumulate:
            self.fill(grad, 0.0)
        self.add_bias_grad(dy, grad.reshape(grad.size))

    # -- BatchNorm over (num, channels, spatial) (kernels/batchnorm.cu) --------------------
    def batchnorm_batch(self, x, eps, out):
        num, channels, spatial = x.shape
        k = self.launcher
        mean, variance, std = (self.empty((channels,)) for _ in range(3))
        k.run(kernels.batchnorm.channel_mean, channels, x.ptr, None, num, spatial, mean.ptr)
        k.run(kernels.batchnorm.channel_variance, channels, x.ptr, mean.ptr, num, spatial,
              float(eps), variance.ptr, std.ptr)
        k.run(kernels.batchnorm.batchnorm_normalize, x.size, x.ptr, mean.ptr, std.ptr, channels,
              spatial, out.ptr)
        return std, mean, variance

    def batchnorm_global(self, x, mean_sum, variance_sum, factor, eps, out):
        num, channels, spatial = x.shape
        k = self.launcher
        mean = self.scale(factor, mean_sum, self.empty((channels,)))
        std = self.scale(factor, variance_sum, self.empty((channels,)))
        k.run(kernels.math.vec_add_scalar, channels, std.ptr, float(eps))
        k.run(kernels.math.vec_sqrt, channels, std.ptr, std.ptr)
        k.run(kernels.batchnorm.batchnorm_normalize, x.size, x.ptr, mean.ptr, std.ptr, channels,
              spatial, out.ptr)
        return std

    def batchnorm_backward(self, dy, y, std, global_stats, dx):
        num, channels, spatial = dy.shape
        k = self.launcher
        mean_dy = mean_dy_y = None
        if not global_stats:
            mean_dy, mean_dy_y = self.empty((channels,)), self.empty((channels,))
            k.run(kernels.batchnorm.channel_mean, channels, dy.ptr, None, num, spatial, mean_dy.ptr)
            k.run(kernels.batchnorm.channel_mean, channels, dy.ptr, y.ptr, num, spatial,
                  mean_dy_y.ptr)
        k.run(kernels.batchnorm.batchnorm_backward, dy.size, dy.ptr, y.ptr,
              None if global_stats else mean_dy.ptr, None if global_stats else mean_dy_y.ptr,
              std.ptr, channels, spatial, int(bool(global_stats)), dx.ptr)

    def running_average(self, stat, fraction, value, scale=1.0):
        self.axpby(scale, value, fraction, stat)

    def dropout_forward(self, x, y, key, ratio, scale):
        """y = x scale where the hashed draws of ``key`` keep it (../dropout_bits.py, made on
        the device); returns what backward needs: the key."""
        self._dropout(x, y, key, ratio, scale)
        return key

    def dropout_backward(self, key, dy, dx, ratio, scale):
        self._dropout(dy, dx, key, ratio, scale)

    def _dropout(self, x, y, key, ratio, scale):
        dropout_bits.check_count(x.size)
        signed = [int(np.uint32(k).astype(np.int32)) for k in key]     # the kernel's int words
        self.launcher.run(kernels.neuron.dropout_apply, x.size, x.ptr, signed[0], signed[1],
                          dropout_bits.threshold(ratio), float(scale), y.ptr)

    def softmax_forward(self, x, y):
        """y = softmax of x (outer, channels, inner) along channels."""
        outer, channels, inner = x.shape
        if x.ptr != y.ptr:
            self.copy(x, y)
        per = self.empty((outer * inner,))
        k = self.launcher
        k.run(kernels.softmax.channel_max, outer * inner, y.ptr, channels, inner, per.ptr)
        k.run(kernels.softmax.channel_subtract, y.size, channels, inner, per.ptr, y.ptr)
        k.run(kernels.math.vec_exp, y.size, y.ptr, y.ptr)
        k.run(kernels.softmax.channel_sum, outer * inner, y.ptr, channels, inner, per.ptr)
        k.run(kernels.softmax.channel_div, y.size, channels, inner, per.ptr, y.ptr)
        return y

    def softmax_backward(self, y, dy, dx):
        """dx = (dy - sum_c dy y) y along channels of (outer, channels, inner)."""
        outer, channels, inner = y.shape
        per = self.empty((outer * inner,))
        k = self.launcher
        k.run(kernels.softmax.channel_dot, outer * inner, dy.ptr, y.ptr, channels, inner, per.ptr)
        if dx.ptr != dy.ptr:
            self.copy(dy, dx)
        k.run(kernels.softmax.channel_subtract, dx.size, channels, inner, per.ptr, dx.ptr)
        k.run(kernels.math.vec_mul, dx.size, dx.ptr, y.ptr, dx.ptr)
        return dx

    def _softmax_loss_terms(self, prob, labels, ignore_label):
        """Per (outer, inner) position: -log p(label), and 1 where the label is not ignored."""
        outer, channels, inner = prob.shape
        n = outer * inner
        loss, counts = self.empty((n,)), self.empty((n,))
        self.launcher.run(kernels.softmax.softmax_loss_forward, n, prob.ptr, labels.ptr, channels,
                          inner, int(ignore_label is not None), int(ignore_label or 0), loss.ptr,
                          counts.ptr)
        return loss, counts

    def softmax_loss_forward_on_device(self, prob, labels, ignore_label, out, count=False):
        """out (one value on the device) = summed -log p(label); with ``count`` also the
        count of labels not ignored, read to the host (None without)."""
        loss, counts = self._softmax_loss_terms(prob, labels, ignore_label)
        self.sum_into(loss, out)
        return self.sum(counts) if count else None

    def softmax_loss_forward(self, prob, labels, ignore_label):
        """(summed -log p(label), count of labels not ignored) over (outer, channels, inner)
        probabilities; ``ignore_label`` None when there is none. NaN for a label out of
        range."""
        loss, counts = self._softmax_loss_terms(prob, labels, ignore_label)
        return self.sum(loss), self.sum(counts)

    def softmax_loss_backward(self, prob, labels, ignore_label, scale, dx):
        """dx = scale (prob - onehot(label)), zero where the label is ignored."""
        outer, channels, inner = prob.shape
        n = outer * inner
        if dx.ptr != prob.ptr:
            self.copy(prob, dx)
        counts = self.empty((n,))
        self.launcher.run(kernels.softmax.softmax_loss_backward, n, labels.ptr, channels, inner,
                          int(ignore_label is not None), int(ignore_label or 0), dx.ptr,
                          counts.ptr)
        self.scale(scale, dx)
        return dx

    def accuracy(self, scores, labels, top_k, ignore_label, per_class=False):
        """(hits, counted) over (outer, channels, inner) scores, and with ``per_class`` the
        per-class accuracies (a host array of channels values)."""
        outer, channels, inner = scores.shape
        n = outer * inner
        hits, counts = self.empty((n,)), self.empty((n,))
        class_hits = class_counts = None
        if per_class:
            class_hits, class_counts = self.zeros((channels, n)), self.zeros((channels, n))
        self.launcher.run(kernels.accuracy.accuracy_forward, n, scores.ptr, labels.ptr, channels,
                          inner, int(top_k), int(ignore_label is not None), int(ignore_label or 0),
                          hits.ptr, counts.ptr, class_hits.ptr if per_class else None,
                          class_counts.ptr if per_class else None)
        result = (self.sum(hits), self.sum(counts))
        if per_class:
            seen = self.to_host(class_counts).sum(axis=1)
            correct = self.to_host(class_hits).sum(axis=1)
            result += (np.where(seen > 0, correct / np.maximum(seen, 1), 0.0),)
        return result

    # -- the solver's update rules (updates.cu) --------------------------------------------
    def solver_update(self, kind, param, data, diff, history, local_rate, iteration,
                      iter_size, local_decay, regularization_type):
        """One parameter's update on the device, in Caffe's order: normalise by iter_size,
        regularise, turn diff into the update value, data -= diff."""
        n = diff.size
        k = self.launcher
        if iter_size != 1:
            self.scale(1.0 / iter_size, diff)
        if local_decay:
            if regularization_type == "L2":
                self.axpby(local_decay, data, 1.0, diff)
            elif regularization_type == "L1":
                sign = self.empty(data.shape)
                k.run(kernels.math.vec_sign, n, data.ptr, sign.ptr)
                self.axpby(local_decay, sign, 1.0, diff)
            else:
                raise ValueError("Unknown regularization type: %r (expected L2 or L1)"
                                 % regularization_type)
        h = [a.ptr for a in history]
        rate = float(local_rate)
        if kind == "SGD":
            k.run(kernels.updates.sgd_update, n, diff.ptr, h[0], float(param.momentum), rate)
        elif kind == "Nesterov":
            k.run(kernels.updates.nesterov_update, n, diff.ptr, h[0], float(param.momentum), rate)
        elif kind == "AdaGrad":
            k.run(kernels.updates.adagrad_update, n, diff.ptr, h[0], float(param.delta), rate)
        elif kind == "RMSProp":
            k.run(kernels.updates.rmsprop_update, n, diff.ptr, h[0], float(param.rms_decay),
                  float(param.delta), rate)
        elif kind == "AdaDelta":
            k.run(kernels.updates.adadelta_update, n, diff.ptr, h[0], h[1], float(param.momentum),
                  float(param.delta), rate)
        elif kind == "Adam":
            t = iteration + 1
            correction = math.sqrt(1.0 - math.pow(param.momentum2, t)) / \
                (1.0 - math.pow(param.momentum, t))
            k.run(kernels.updates.adam_update, n, diff.ptr, h[0], h[1], float(param.momentum),
                  float(param.momentum2), float(param.delta), rate * correction)
        else:
            raise ValueError("no update rule for solver type %r" % kind)
        self.axpby(-1.0, diff, 1.0, data)

    # -- BLAS ------------------------------------------------------------------------------
    def gemm(self, a, b, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, out=None):
        """out = alpha op(a) op(b) + beta out, row-major 2-d device arrays."""
        m = a.shape[1] if trans_a else a.shape[0]
        k = a.shape[0] if trans_a else a.shape[1]
        n = b.shape[0] if trans_b else b.shape[1]
        kb = b.shape[1] if trans_b else b.shape[0]
        if kb != k:
            raise ValueError("gemm: op(a) is %dx%d, op(b) is %dx%d" % (m, k, kb, n))
        if out is None:
            out, beta = self.empty((m, n)), 0.0
        if out.size != m * n:
            raise ValueError("gemm: out has shape %s, the product is %dx%d" % (out.shape, m, n))
        # row-major out = op(a) op(b) is column-major out^T = op(b)^T op(a)^T
        self.blas.sgemm("T" if trans_b else "N", "T" if trans_a else "N", n, m, k, float(alpha),
                        b.ptr, max(b.shape[1], 1), a.ptr, max(a.shape[1], 1), float(beta),
                        out.ptr, max(n, 1))
        return out

    def sumsq(self, x):
        return float(self.blas.sdot(x.size, x.ptr, 1, x.ptr, 1)) if x.size else 0.0

    # -- vision ----------------------------------------------------------------------------
    def conv_plan(self, geom, batch=None):
        from .conv import ConvPlan
        return ConvPlan(self, geom)

    def im2col(self, x, geom):
        from .conv import im2col
        n = x.shape[0]
        col = self.empty((n, geom.col_rows) + geom.out_shape)
        im2col(self, x, geom, col)
        return col

    def col2im(self, col, geom):
        from .conv import col2im
        n = col.shape[0]
        x = self.empty((n, geom.channels) + geom.in_shape)
        col2im(self, col, geom, x)
        return x

    def pool_plan(self, geom):
        from .pool import PoolPlan
        return PoolPlan(self, geom)

    def lrn_forward(self, x, size, alpha, beta, k, across_channels, out=None, state=None):
        n, c, h, w = x.shape
        scale = state if state is not None and state.shape == x.shape else self.empty(x.shape)
        if across_channels:
            self.launcher.run(kernels.lrn.lrn_scale_across, x.size, x.ptr, c, h, w, size,
                              alpha / size, k, scale.ptr)
        else:
            self.launcher.run(kernels.lrn.lrn_scale_within, x.size, x.ptr, h, w, size,
                              alpha / (size * size), scale.ptr)
        top = out if out is not None else self.empty(x.shape)
        self.launcher.run(kernels.lrn.lrn_output, x.size, x.ptr, scale.ptr, beta, top.ptr)
        return top, scale

    def lrn_backward(self, x, top, state, dy, size, alpha, beta, across_channels, out=None):
        n, c, h, w = x.shape
        dx = out if out is not None else self.empty(x.shape)
        norm = size if across_channels else size * size
        coef = 2.0 * alpha * beta / norm
        if across_channels:
            self.launcher.run(kernels.lrn.lrn_diff_across, x.size, x.ptr, top.ptr, state.ptr,
                              dy.ptr, c, h, w, size, beta, coef, dx.ptr)
        else:
            self.launcher.run(kernels.lrn.lrn_diff_within, x.size, x.ptr, top.ptr, state.ptr,
                              dy.ptr, h, w, size, beta, coef, dx.ptr)
        return dx

    def describe(self):
        """device_query's lines for this device."""
        return ["%s: %s" % (label, value) for label, value in
                self.driver.info.query_lines() + self.driver.library_lines()]


__all__ = ["CUDABackend", "DeviceArray", "DeviceMemoryError", "PoolGeometry", "driver_kind"]
