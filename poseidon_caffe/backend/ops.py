"""The seam between layers and the hardware, written as code: ``Backend`` declares every op a
layer, a solver or the sync engine may ask of a backend, each with its contract.

``cpu/`` (numpy) and ``cuda/`` (a device) implement it. Arrays are the backend's own (numpy
arrays on the CPU, ``DeviceArray``s on a device; numpy cannot read a device array, ``to_host``
is the way back); shapes are Caffe's (N, C, ...); float32 unless an op says otherwise. An op
writes only its outputs. A backend that lacks an op cannot be made (an abstract method), and
``tests/test_backend_seam.py`` fails when code outside the backend calls an attribute of a
backend that is not declared here.

Ops marked *device only* exist where memory is a device's (``on_device``): a backend without
one inherits the refusal below, one line naming the op. The device's own machinery that the
sync engine needs (pinned buffers, streams, events, asynchronous copies, the calling thread's
context) is part of the seam too, and the CPU backend implements it as what it is there:
host memory is already "pinned", and a copy is done when it returns.
"""
import abc
import dataclasses

import numpy as np

op = abc.abstractmethod


class DeviceOnly(RuntimeError):
    """A device-only op asked of a backend whose memory is the host's."""


def device_only(method):
    """The contract of an op that only a device backend implements; elsewhere it refuses."""
    def refuse(self, *args, **kwargs):
        raise DeviceOnly("%s is a device op: the %s backend has no device memory"
                         % (method.__name__, self.name))
    refuse.__name__ = method.__name__
    refuse.__qualname__ = method.__qualname__
    refuse.__doc__ = method.__doc__
    refuse.device_only = True
    return refuse


@dataclasses.dataclass
class Transfers:
    """What crossed between the host and a device: calls and bytes, host to device, device to
    host, device to device; and the host's waits for the device.

    ``host_syncs`` counts the waits of the thread that opened the device (the one that drives
    the computation): ``synchronize()``, a stream's or an event's ``synchronize()``, a copy to
    the host without a stream, and a BLAS call that returns a scalar to the host (sdot, sasum).
    ``background_syncs`` counts the same waits made on other threads (a prefetch thread
    waiting for its own stream), which do not hold the computation up."""
    htod_calls: int = 0
    htod_bytes: int = 0
    dtoh_calls: int = 0
    dtoh_bytes: int = 0
    dtod_calls: int = 0
    dtod_bytes: int = 0
    host_syncs: int = 0
    background_syncs: int = 0

    def snapshot(self):
        return Transfers(**self.__dict__)

    def since(self, earlier):
        return Transfers(**{k: v - getattr(earlier, k) for k, v in self.__dict__.items()})


class Backend(abc.ABC):
    """Every op of a backend. Subclasses set the four attributes and implement every method
    not marked device only."""

    name = None          # "cpu", "cuda"
    dtype = np.float32   # the dtype of every float array
    on_device = False    # whether arrays live in a device's memory (not readable by numpy)
    emulated = False     # whether the device is the emulated test device
    device = None        # the number of the device the backend drives (None: the host)
    # ``xp``: the array namespace for light elementwise work where a layer has no named op
    # (numpy on the CPU; a device has none and says so on first use)
    xp = None

    # -- memory and copies -----------------------------------------------------------------
    @op
    def empty(self, shape, dtype=None):
        """A new uninitialised array of ``shape`` (float32, or ``dtype``)."""

    @op
    def zeros(self, shape, dtype=None):
        """A new array of zeros."""

    @op
    def to_device(self, array, dtype=None):
        """A backend array holding the host array's values (the array itself where it is
        already the backend's, contiguous and of that dtype)."""

    @op
    def to_host(self, array):
        """A numpy array of the backend array's values (the way back from a device)."""

    @op
    def upload(self, host, out):
        """``out`` <- the host array ``host``, values of the same count (a batch into its
        blob); returns ``out``."""

    @op
    def fill(self, out, value):
        """Every value of ``out`` = ``value``."""

    @op
    def copy(self, src, out):
        """``out`` <- ``src``, values of the same count."""

    @op
    def synchronize(self):
        """Wait for the work queued so far (timings are read after it); nothing on the CPU."""

    @op
    def describe(self):
        """device_query's lines for this backend: [\"label: value\", ...]."""

    # -- the host side of a device: what the sync engine moves over the bus ----------------
    @op
    def pinned_empty(self, shape, dtype=np.float32):
        """A numpy array in page-locked host memory, so copies to and from it can run while
        the host goes on."""

    @op
    def stream(self, non_blocking=False):
        """A new queue of copies: ``.synchronize()``; a ``non_blocking`` one keeps no order
        with the default queue (a prefetch thread's copies then overlap the computation)."""

    @op
    def event(self):
        """A new event: ``.record(stream=None)`` marks the work queued so far on ``stream``;
        ``.query()`` says whether it is done, ``.synchronize()`` waits for it,
        ``.elapsed_ms(start_event)``."""

    @op
    def copy_to_host(self, dst, src, stream=None):
        """The C-contiguous numpy array ``dst`` <- the backend array ``src`` (the same count
        of values): done on return without a stream; queued on ``stream`` with one, complete
        once an event recorded after it is."""

    @op
    def enter_thread(self):
        """Make the device usable from the calling thread (a prefetch thread, the
        communication thread); ``leave_thread`` before that thread ends."""

    @op
    def leave_thread(self):
        """Undo ``enter_thread`` on the calling thread."""

    @op
    def transfers_now(self):
        """A ``Transfers`` snapshot of what crossed so far (all zeros where nothing crosses);
        ``later.since(earlier)`` is what crossed in between."""

    # -- device only: memory addressed by pointer, and work kept on the device -------------
    @device_only
    def view(self, ptr, shape, owner):
        """The device array of ``shape`` at device address ``ptr`` inside memory ``owner``
        keeps alive (a blob's SyncedMemory)."""

    @device_only
    def synced_memory(self, count):
        """Caffe's SyncedMemory of ``count`` floats on this device (a blob's data or diff)."""

    @device_only
    def batch_ring(self, depth):
        """``depth`` slots of pinned host and device buffers on a stream of their own, through
        which a prefetch thread uploads batches (cuda/batch_ring.py)."""

    @device_only
    def sum_into(self, x, out, squares=False):
        """``out`` (one value on the device) = the sum of ``x``, or of its squares: a loss
        that stays on the device."""

    @device_only
    def divide(self, x, divisor, out):
        """``out`` = ``x`` / ``divisor`` (a host float), rounded as one float division."""

    @device_only
    def softmax_loss_forward_on_device(self, prob, labels, ignore_label, out, count=False):
        """``out`` (one value on the device) = the summed -log p(label); with ``count``, the
        count of labels not ignored is returned too (a host int)."""

    @device_only
    def solver_update(self, kind, param, data, diff, history, local_rate, iteration,
                      iter_size, local_decay, regularization_type):
        """One parameter's update on the device in Caffe's order: normalise ``diff`` by
        ``iter_size``, regularise it (L2 or L1 at ``local_decay``), turn it into the update
        value of solver ``kind`` with ``history``, then ``data -= diff``."""

    # -- light arithmetic --------------------------------------------------------------------
    @op
    def axpby(self, alpha, x, beta, y):
        """y = alpha x + beta y."""

    @op
    def scale(self, alpha, x, out=None):
        """out = alpha x (in place without ``out``); returns the result."""

    @op
    def sum(self, x):
        """The sum of x as a Python float (read back to the host)."""

    @op
    def add(self, a, b, out):
        """out = a + b, of one shape."""

    @op
    def subtract(self, a, b, out):
        """out = a - b, of one shape."""

    @op
    def add_bias(self, y, bias):
        """y (outer, channels, inner) += bias (channels), broadcast over outer and inner."""

    @op
    def add_bias_grad(self, dy, dbias):
        """dbias (channels) += dy (outer, channels, inner) summed over outer and inner."""

    @op
    def running_average(self, stat, fraction, value, scale=1.0):
        """stat = stat fraction + scale value (BatchNorm's running sums)."""

    # -- neurons -----------------------------------------------------------------------------
    @op
    def relu_forward(self, x, y, slope):
        """y = x where x > 0, else slope x (Caffe's leaky ReLU; slope 0: ReLU)."""

    @op
    def relu_backward(self, x, dy, dx, slope):
        """dx = dy where x > 0, else slope dy."""

    @op
    def neuron_forward(self, kind, x, y, *params):
        """y = the neuron map ``kind`` of x (cpu/neuron.py's names: sigmoid, tanh, absval,
        bnll, power, exp, log, threshold, clip, elu, swish) with its layer's ``params``;
        returns the arrays its backward reads besides dy."""

    @op
    def neuron_backward(self, kind, dy, *arrays_and_params):
        """dx of the neuron map ``kind``: called as (dy, inputs..., dx, params...), the
        inputs being what neuron_forward returned."""

    @op
    def dropout_forward(self, x, y, key, ratio, scale):
        """y = x scale where the draws of ``key`` (dropout_bits.py: a hash of the key and
        each index, the same bits on every backend) keep it, else x times 0; returns what
        dropout_backward needs."""

    @op
    def dropout_backward(self, state, dy, dx, ratio, scale):
        """dx = dy scale where forward kept, else dy times 0 (state: what forward
        returned)."""

    # -- the families of common_ops ------------------------------------------------------------
    @op
    def softmax_forward(self, x, y):
        """y = softmax of x (outer, channels, inner) along channels, shifted by the max."""

    @op
    def softmax_backward(self, y, dy, dx):
        """dx = (dy - sum_c dy y) y along the channels of (outer, channels, inner)."""

    @op
    def eltwise_forward(self, op, xs, coeffs, y):
        """Eltwise "prod", "sum" (with ``coeffs``) or "max" of the arrays ``xs`` into y;
        returns MAX's argmax (int32: which input won), else None."""

    @op
    def eltwise_backward(self, op, i, xs, y, dy, dx, coeffs, argmax, stable_prod_grad):
        """dx of input ``i`` of eltwise_forward (Caffe's stable_prod_grad choice for PROD)."""

    @op
    def axis_copy(self, part, whole, axis, offset, to_whole):
        """Concat/Slice: ``part`` is the slab at ``offset`` along ``axis`` of ``whole``;
        ``to_whole`` copies part into whole, else whole into part."""

    @op
    def crop_copy(self, big, small, offsets, to_small):
        """Crop: small <- the window of big at ``offsets`` (``to_small``), or that window of
        big <- small."""

    @op
    def tile_forward(self, x, y):
        """y (outer, tiles, inner) = x (outer, 1, inner) repeated."""

    @op
    def tile_backward(self, dy, dx):
        """dx (outer, 1, inner) = dy (outer, tiles, inner) summed over the tiles."""

    @op
    def embed_forward(self, indices, index_values, weight, y):
        """y (count, N) = weight[indices]; ``indices`` the checked host integers,
        ``index_values`` the bottom's values."""

    @op
    def embed_backward(self, indices, index_values, dy, weight_diff):
        """weight_diff[indices] += dy, repeated indices summed."""

    @op
    def scale_forward(self, x, scale, bias, y):
        """y = x scale[d] (+ bias[d]) over x as (outer, dim, inner)."""

    @op
    def scale_backward(self, x, scale, dy, dx):
        """dx = dy scale[d]."""

    @op
    def broadcast_grad(self, dy, grad, accumulate, x=None):
        """grad (dim) (+= with ``accumulate``) = dy (times x) summed over outer and inner,
        summed in float64."""

    @op
    def batchnorm_batch(self, x, eps, out):
        """out = x (outer, channels, inner) normalised by its own per-channel statistics;
        returns (std, mean, variance)."""

    @op
    def batchnorm_global(self, x, mean_sum, variance_sum, factor, eps, out):
        """out = x normalised by stored statistics (the sums times ``factor``); returns std."""

    @op
    def batchnorm_backward(self, dy, y, std, global_stats, dx):
        """dx of batchnorm_batch (or of batchnorm_global with ``global_stats``)."""

    @op
    def reduction_forward(self, x, op, coeff, y):
        """y (num) = op ("SUM", "ASUM", "SUMSQ", "MEAN") over each row of x (num, dim),
        times ``coeff``."""

    @op
    def reduction_backward(self, x, dy, op, coeff, dx):
        """dx of reduction_forward."""

    @op
    def argmax(self, x, axis, top_k, out_max_val, y):
        """ArgMax: indices (with out_max_val values, or both without an axis) of the top_k
        largest along ``axis`` (ties: the larger index first)."""

    @op
    def gather_rows(self, x, rows, y):
        """y = x[rows] along axis 0, ``rows`` host indices (Filter, BatchReindex)."""

    @op
    def scatter_rows(self, dy, rows, dx, unique=False):
        """dx = 0, then dy's row t added into dx's row rows[t] (``unique``: no row twice)."""

    @op
    def accuracy(self, scores, labels, top_k, ignore_label, per_class=False):
        """(hits, counted) of top-k over (outer, channels, inner) scores; with
        ``per_class`` also each class's accuracy (a numpy array)."""

    # -- losses (loss_ops) -------------------------------------------------------------------
    @op
    def softmax_loss_forward(self, prob, labels, ignore_label):
        """(summed -log p(label), count not ignored); NaN for a label out of range (the
        layer then names it from the host labels)."""

    @op
    def softmax_loss_backward(self, prob, labels, ignore_label, scale, dx):
        """dx = scale (prob - onehot(label)), zero where the label is ignored."""

    @op
    def hinge_forward(self, x, labels, l2):
        """x as (num, dim), one label per item: (sum of margins or of their squares, state)."""

    @op
    def hinge_backward(self, state, labels, l2, scale, dx):
        """dx of hinge_forward times ``scale``."""

    @op
    def contrastive_forward(self, a, b, similar, margin, legacy):
        """a, b as (num, dim), one similarity per pair: (summed loss, state)."""

    @op
    def contrastive_backward(self, state, a, b, margin, legacy, outputs):
        """``outputs``: (alpha, dx) pairs; each dx = alpha w (a - b), w per pair."""

    @op
    def infogain_forward(self, prob, labels, h, ignore_label):
        """prob (outer, channels, inner), H (channels, channels): (summed loss, count,
        state)."""

    @op
    def infogain_backward(self, state, prob, labels, h, ignore_label, scale, dx):
        """dx of infogain_forward times ``scale``."""

    @op
    def multinomial_logistic_forward(self, prob, labels):
        """prob as (num, dim), one label per item: the summed -log p(label)."""

    @op
    def multinomial_logistic_backward(self, prob, labels, scale, dx):
        """dx = -scale / p(label) at each label, 0 elsewhere."""

    @op
    def sigmoid_cross_entropy_forward(self, x, target, ignore_label):
        """x, targets flat: (summed loss, count, state)."""

    @op
    def sigmoid_cross_entropy_backward(self, state, x, target, ignore_label, scale, dx):
        """dx = scale (sigmoid(x) - target), zero where the target is ignored."""

    # -- MVN, PReLU, recurrent steps (mvn_ops, prelu_ops, recurrent_ops) ----------------------
    @op
    def mvn_forward(self, x, normalize_variance, eps, y):
        """Over rows of (rows, dim): y = x minus the row mean, divided by the row's std + eps
        with ``normalize_variance``; returns std (None without it). y may be x."""

    @op
    def mvn_backward(self, dy, y, std, dx):
        """dx from the top gradient dy, the top y and the forward's std (None: mean only);
        dx may be dy."""

    @op
    def prelu_forward(self, x, y, slopes, shared):
        """x, y as (N, C, rest); slopes one per channel, or one ``shared``."""

    @op
    def prelu_backward(self, x, dy, slopes, shared, dx=None, dslopes=None):
        """dx (when given) = dy scaled by the slope where x <= 0; dslopes (when given) +=
        dy x where x <= 0, summed per channel (or over all)."""

    @op
    def step(self, a, t):
        """The view of a[t] (time step t of a (T, ...) array)."""

    @op
    def steps(self, a, start, stop):
        """The view of a[start:stop] along the first axis."""

    @op
    def scale_rows(self, x, c, out):
        """out (N, H) = x scaled per row by c (N); out may be x."""

    @op
    def lstm_unit_forward(self, c_prev, gates, cont, c, h):
        """c, h (N, H) of one LSTM step from the gates (N, 4H); returns the cache
        lstm_unit_backward reads."""

    @op
    def lstm_unit_backward(self, c_prev, cont, cache, dc, dh, dc_prev, dgates):
        """d c_prev (N, H) and d gates (N, 4H) of one step; dc_prev may be dc."""

    # -- BLAS --------------------------------------------------------------------------------
    @op
    def gemm(self, a, b, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, out=None):
        """out = alpha op(a) op(b) + beta out over row-major 2-d arrays (a new array without
        ``out``); returns out."""

    @op
    def sumsq(self, x):
        """The sum of squares of x, a Python float (gradient clipping)."""

    # -- vision: plans and whole-batch ops (conv, pool, lrn) ----------------------------------
    @op
    def conv_plan(self, geom, batch=None):
        """A plan for a ``ConvGeometry`` (geometry.py) at batch size ``batch``:
        ``forward(x, w, bias, y)`` (bias may be None); ``backward(x, dy, w, dx=None,
        dw=None, dbias=None)`` writes dx and adds into dw and dbias; ``prepare(x)``;
        ``workspace_bytes(n)``, its buffers for a batch of n (the net's memory estimate). It
        may keep what its last forward computed from x for the backward on the same array."""

    @op
    def pool_plan(self, geom):
        """A plan for a ``PoolGeometry``: ``max_forward(x, y)``, ``mask()``,
        ``routed_backward(dy, dx)``, ``ave_forward(x, y)``, ``ave_backward(dy, dx,
        add=False)`` (with ``add``, dx += the gradient: net/split_folding.py),
        ``stochastic_forward_train(x, y, uniform)``, ``stochastic_forward_test(x, y)``,
        ``stochastic_backward_test(x, dy, dx)``; it keeps the winners of its last forward."""

    @op
    def im2col(self, x, geom):
        """Caffe's Im2col layout: (N, C, *in) -> (N, C*taps, *out), rows ordered (channel,
        kernel taps)."""

    @op
    def col2im(self, col, geom):
        """The adjoint of im2col: (N, C*taps, *out) -> (N, C, *in), overlapping taps summed."""

    @op
    def lrn_forward(self, x, size, alpha, beta, k, across_channels, out=None, state=None):
        """(top, state) of Caffe's LRN on (N, C, H, W): across channels scale = k +
        alpha/size sum x^2 over the window of channels, within a channel 1 + alpha/size^2
        sum x^2 over size x size; top = x scale^-beta. ``out`` receives top; an earlier
        ``state`` of the same shape lends its buffers."""

    @op
    def lrn_backward(self, x, top, state, dy, size, alpha, beta, across_channels, out=None):
        """d bottom of lrn_forward (into ``out`` when given)."""

    # -- the contract as data: what the seam test reads ------------------------------------
    @classmethod
    def ops(cls):
        """The names of every op and attribute of the contract."""
        return sorted(name for name in vars(Backend)
                      if not name.startswith("_") and name not in ("ops", "device_ops"))

    @classmethod
    def device_ops(cls):
        """The names of the device-only ops."""
        return sorted(name for name, value in vars(Backend).items()
                      if getattr(value, "device_only", False))
