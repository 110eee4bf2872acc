"""Layer family: vision (Convolution, Deconvolution, Pooling, SPP, LRN, Im2col, Crop).

Parameters, defaults, output-size rules and errors are Caffe's; the arithmetic is the backend's
op set (conv plans, pool plans, LRN), so each layer is written once for every backend.
"""
import math

import numpy as np

from ..backend.geometry import ConvGeometry, PoolGeometry
from ..proto import caffe_pb2
from ..rng import get_rng
from .base import Layer
from .registry import register

_POOL = caffe_pb2.PoolingParameter
_LRN = caffe_pb2.LRNParameter


# -- convolution parameters ----------------------------------------------------------------
_TWO_D_NAMES = {"kernel_size": ("kernel_h", "kernel_w"), "stride": ("stride_h", "stride_w"),
                "pad": ("pad_h", "pad_w")}


def _spatial_values(layer, cp, name, n_spatial, default):
    """Caffe's repeated ``name`` (one value, or one per spatial axis) or the 2-D name_h/name_w."""
    values = list(getattr(cp, name))
    hw_names = _TWO_D_NAMES.get(name)
    has_hw = hw_names is not None and (cp.HasField(hw_names[0]) or cp.HasField(hw_names[1]))
    if has_hw:
        if n_spatial != 2:
            raise layer.error("%s & %s can only be used for 2D convolution (this bottom has "
                              "%d spatial axes)" % (hw_names[0], hw_names[1], n_spatial))
        if values:
            raise layer.error("either %s or %s/%s should be specified; not both"
                              % (name, hw_names[0], hw_names[1]))
        if name == "kernel_size" and not (cp.HasField("kernel_h") and cp.HasField("kernel_w")):
            raise layer.error("for non-square filters both kernel_h and kernel_w are required")
        return [getattr(cp, hw_names[0]), getattr(cp, hw_names[1])]
    if not values:
        if default is None:
            raise layer.error("kernel_size (or kernel_h and kernel_w) must be specified")
        return [default] * n_spatial
    if len(values) not in (1, n_spatial):
        raise layer.error("%s must be specified once, or once per spatial dimension "
                          "(%s given for %d spatial axes)" % (name, len(values), n_spatial))
    return values * n_spatial if len(values) == 1 else values


def _read_window_geometry(layer, cp, bottom):
    """Channel axis, spatial axes, kernel, stride, pad and dilation of a ConvolutionParameter,
    checked as Caffe checks them (Convolution, Deconvolution and Im2col share them)."""
    try:
        layer.channel_axis = bottom.canonical_axis_index(cp.axis)
    except ValueError as exc:
        raise layer.error("axis %d: %s" % (cp.axis, exc))
    n = bottom.num_axes - layer.channel_axis - 1
    if n < 1:
        raise layer.error("needs at least one spatial axis after the channel axis %d; bottom "
                          "shape is %s" % (layer.channel_axis, bottom.shape))
    layer.num_spatial = n
    layer.kernel = _spatial_values(layer, cp, "kernel_size", n, None)
    if any(k == 0 for k in layer.kernel):
        raise layer.error("filter dimensions must be nonzero, got %s" % (layer.kernel,))
    layer.stride = _spatial_values(layer, cp, "stride", n, 1)
    if any(s == 0 for s in layer.stride):
        raise layer.error("stride dimensions must be nonzero, got %s" % (layer.stride,))
    layer.pad = _spatial_values(layer, cp, "pad", n, 0)
    layer.dilation = _spatial_values(layer, cp, "dilation", n, 1)
    if any(d == 0 for d in layer.dilation):
        raise layer.error("dilation must be nonzero, got %s" % (layer.dilation,))


class _ConvolutionBase(Layer):
    """What Convolution and Deconvolution share: Caffe's BaseConvolutionLayer."""
    min_bottoms = 1
    min_tops = 1
    equal_bottom_top = True
    transposed = False

    def setup(self, bottom, top):
        cp = self.param.convolution_param
        shape = bottom[0].shape
        _read_window_geometry(self, cp, bottom[0])
        self.channels = shape[self.channel_axis]
        self.num_output = cp.num_output
        if self.num_output <= 0:
            raise self.error("num_output must be specified and positive")
        self.group = cp.group
        if self.group <= 0:
            raise self.error("group must be positive, got %d" % self.group)
        if self.channels % self.group:
            raise self.error("number of input channels (%d) should be a multiple of group (%d)"
                             % (self.channels, self.group))
        if self.num_output % self.group:
            raise self.error("number of outputs (%d) should be a multiple of group (%d)"
                             % (self.num_output, self.group))
        self.bias_term = cp.bias_term
        if self.transposed:
            conv_out, conv_in = self.channels, self.num_output
        else:
            conv_out, conv_in = self.num_output, self.channels
        weight_shape = (conv_out, conv_in // self.group) + tuple(self.kernel)
        shapes = [weight_shape] + ([(self.num_output,)] if self.bias_term else [])
        if self.blobs:
            # Caffe's texts; a legacy model stores the bias as (1, 1, 1, M)
            self.check_loaded_blobs(
                shapes, legacy_padding_only=True,
                count_text="incorrect number of weight blobs: expected {want}, got {got}",
                shape_text="incorrect weight shape: expected shape {want}; instead, shape was "
                           "{got}")
        else:
            from .. import fillers
            from ..blob import Blob
            weight = Blob(weight_shape)
            fillers.fill(weight, cp.weight_filler)
            self.blobs = [weight]
            if self.bias_term:
                bias = Blob((self.num_output,))
                fillers.fill(bias, cp.bias_filler)
                self.blobs.append(bias)
        self.param_propagate_down = [True] * len(self.blobs)
        self._plans = []
        self._geom_key = None

    def _check_bottoms(self, bottom):
        first = bottom[0].shape
        if len(first) != self.channel_axis + 1 + self.num_spatial:
            raise self.error("bottom num_axes may not change: expected %d axes, got shape %s"
                             % (self.channel_axis + 1 + self.num_spatial, first))
        if first[self.channel_axis] != self.channels:
            raise self.error("input size incompatible with convolution kernel: bottom has %d "
                             "channels, the weights expect %d"
                             % (first[self.channel_axis], self.channels))
        for i, b in enumerate(bottom[1:], 1):
            if b.shape != first:
                raise self.error("shape mismatch - bottom[0]: %s vs. bottom[%d]: %s"
                                 % (bottom[0].shape_string(), i, b.shape_string()))

    def _make_plans(self, geom, count, batch):
        key = (geom.key(), batch)
        if self._geom_key != key or len(self._plans) != count:
            self._plans = [self.backend.conv_plan(geom, batch) for _ in range(count)]
            self._geom_key = key

    def workspace_bytes(self):
        """Work buffers of this layer's plans at the current batch (for the net's memory
        estimate)."""
        batch = self._geom_key[1] if self._geom_key else 0
        return sum(getattr(plan, "workspace_bytes", lambda n: 0)(batch) for plan in self._plans)

    def shared_workspace_bytes(self):
        """Work arrays in the threads' scratch, which every layer shares (the net counts the
        largest layer's once)."""
        batch = self._geom_key[1] if self._geom_key else 0
        return max([getattr(plan, "shared_workspace_bytes", lambda n: 0)(batch)
                    for plan in self._plans] or [0])

    def _batch_view(self, array, channels, spatial):
        """``array`` as (samples, channels, *spatial): axes before the channel axis are all
        independent samples. The same array gives the same object every call, as a plan knows
        its input by identity: the backward right after a forward reuses the columns (or
        spectrum) that forward made instead of computing them again."""
        shape = (-1, channels) + tuple(spatial)
        if array.ndim == len(shape) and array.shape[1:] == shape[1:]:
            return array
        views = self.__dict__.setdefault("_views", {})
        kept = views.get(id(array))
        if kept is None or kept[0] is not array or kept[1].shape[1:] != shape[1:]:
            if len(views) >= 8:              # blobs reshaped since: forget their old arrays
                views.clear()
            kept = views[id(array)] = (array, array.reshape(shape))
        return kept[1]


@register("Convolution")
class ConvolutionLayer(_ConvolutionBase):
    device_ready = True

    def reshape(self, bottom, top):
        self._check_bottoms(bottom)
        in_spatial = bottom[0].shape[self.channel_axis + 1:]
        geom = ConvGeometry(self.channels, self.num_output, in_spatial, self.kernel, self.stride,
                            self.pad, self.dilation, self.group)
        if any(o <= 0 for o in geom.out_shape):
            raise self.error("the kernel %s (dilation %s, pad %s) does not fit the input %s"
                             % (tuple(self.kernel), tuple(self.dilation), tuple(self.pad),
                                tuple(in_spatial)))
        self.geom = geom
        out_shape = bottom[0].shape[:self.channel_axis] + (self.num_output,) + geom.out_shape
        for t in top:
            t.reshape(out_shape)
        self._make_plans(geom, len(bottom), bottom[0].count_axes(0, self.channel_axis))

    def forward(self, bottom, top):
        g = self.geom
        w = self.blobs[0].dev_data
        bias = self.blobs[1].dev_data if self.bias_term else None
        for plan, b, t in zip(self._plans, bottom, top):
            plan.forward(self._batch_view(b.dev_data, g.channels, g.in_shape), w, bias,
                         self._batch_view(t.mutable_dev_data, g.num_output, g.out_shape))

    def backward(self, top, propagate_down, bottom):
        g = self.geom
        w = self.blobs[0].dev_data
        dw = self.blobs[0].mutable_dev_diff if self.param_propagate_down[0] else None
        db = (self.blobs[1].mutable_dev_diff if self.bias_term and self.param_propagate_down[1]
              else None)
        for i, (plan, b, t) in enumerate(zip(self._plans, bottom, top)):
            dx = (self._batch_view(b.mutable_dev_diff, g.channels, g.in_shape)
                  if propagate_down[i] else None)
            plan.backward(self._batch_view(b.dev_data, g.channels, g.in_shape),
                          self._batch_view(t.dev_diff, g.num_output, g.out_shape), w,
                          dx=dx, dw=dw, dbias=db)


@register("Deconvolution")
class DeconvolutionLayer(_ConvolutionBase):
    """The transpose of Convolution: output = stride*(in-1) + dilated kernel - 2*pad."""
    transposed = True
    device_ready = True

    def reshape(self, bottom, top):
        self._check_bottoms(bottom)
        in_spatial = bottom[0].shape[self.channel_axis + 1:]
        out_spatial = tuple(s * (i - 1) + d * (k - 1) + 1 - 2 * p for i, k, s, p, d in
                            zip(in_spatial, self.kernel, self.stride, self.pad, self.dilation))
        if any(o <= 0 for o in out_spatial):
            raise self.error("output size %s is not positive for input %s, kernel %s, stride "
                             "%s, pad %s" % (out_spatial, tuple(in_spatial), tuple(self.kernel),
                                             tuple(self.stride), tuple(self.pad)))
        # the convolution this layer transposes: top -> bottom
        geom = ConvGeometry(self.num_output, self.channels, out_spatial, self.kernel,
                            self.stride, self.pad, self.dilation, self.group)
        self.geom = geom
        out_shape = bottom[0].shape[:self.channel_axis] + (self.num_output,) + out_spatial
        for t in top:
            t.reshape(out_shape)
        self._make_plans(geom, len(bottom), bottom[0].count_axes(0, self.channel_axis))

    def forward(self, bottom, top):
        g = self.geom
        w = self.blobs[0].dev_data
        for plan, b, t in zip(self._plans, bottom, top):
            y = self._batch_view(t.mutable_dev_data, g.channels, g.in_shape)
            plan.backward(None, self._batch_view(b.dev_data, g.num_output, g.out_shape), w,
                          dx=y)
            if self.bias_term:
                self.backend.add_bias(y.reshape(y.shape[0], g.channels, g.in_count),
                                      self.blobs[1].dev_data)

    def backward(self, top, propagate_down, bottom):
        g = self.geom
        w = self.blobs[0].dev_data
        dw = self.blobs[0].mutable_dev_diff if self.param_propagate_down[0] else None
        for i, (plan, b, t) in enumerate(zip(self._plans, bottom, top)):
            dtop = self._batch_view(t.dev_diff, g.channels, g.in_shape)
            if self.bias_term and self.param_propagate_down[1]:
                self.backend.add_bias_grad(dtop.reshape(dtop.shape[0], g.channels, g.in_count),
                                           self.blobs[1].mutable_dev_diff)
            x = self._batch_view(b.dev_data, g.num_output, g.out_shape)
            if propagate_down[i]:
                # the bottom gradient is the forward convolution of the top gradient
                plan.forward(dtop, w, None,
                             self._batch_view(b.mutable_dev_diff, g.num_output, g.out_shape))
                if dw is not None:
                    plan.backward(dtop, x, w, dw=dw)      # reuses what forward took from dtop
            elif dw is not None:
                plan.prepare(dtop)
                plan.backward(dtop, x, w, dw=dw)


# -- pooling --------------------------------------------------------------------------------
def _pooled_size(size, kernel, stride, pad, round_mode):
    """Caffe's pooled size: rounded up (or down), minus a last window that starts in the pad."""
    span = size + 2 * pad - kernel
    if round_mode == _POOL.FLOOR:
        pooled = span // stride + 1
    else:
        pooled = int(math.ceil(span / float(stride))) + 1
    if pad and (pooled - 1) * stride >= size + pad:
        pooled -= 1
    return pooled


@register("Pooling")
class PoolingLayer(Layer):
    device_ready = True
    exact_bottoms = 1
    min_tops = 1

    @property
    def max_tops(self):
        return 2 if self.param.pooling_param.pool == _POOL.MAX else 1

    def setup(self, bottom, top):
        pp = self.param.pooling_param
        self.method = pp.pool
        has_kernel = pp.HasField("kernel_size") or pp.HasField("kernel_h") or \
            pp.HasField("kernel_w")
        self.global_pooling = pp.global_pooling
        if self.global_pooling:
            if has_kernel:
                raise self.error("with global_pooling: true, a filter size cannot be specified")
        else:
            if pp.HasField("kernel_size") and (pp.HasField("kernel_h") or
                                               pp.HasField("kernel_w")):
                raise self.error("filter size is kernel_size OR kernel_h and kernel_w; not both")
            if not pp.HasField("kernel_size") and not (pp.HasField("kernel_h") and
                                                       pp.HasField("kernel_w")):
                raise self.error("for non-square filters both kernel_h and kernel_w are "
                                 "required (or give kernel_size)")
        if pp.HasField("pad") and (pp.HasField("pad_h") or pp.HasField("pad_w")):
            raise self.error("pad is pad OR pad_h and pad_w; not both")
        if (pp.HasField("pad_h") or pp.HasField("pad_w")) and not (
                pp.HasField("pad_h") and pp.HasField("pad_w")):
            raise self.error("pad_h and pad_w are required together")
        if pp.HasField("stride") and (pp.HasField("stride_h") or pp.HasField("stride_w")):
            raise self.error("stride is stride OR stride_h and stride_w; not both")
        if (pp.HasField("stride_h") or pp.HasField("stride_w")) and not (
                pp.HasField("stride_h") and pp.HasField("stride_w")):
            raise self.error("stride_h and stride_w are required together")
        if pp.HasField("kernel_size"):
            self.kernel = [pp.kernel_size, pp.kernel_size]
        elif not self.global_pooling:
            self.kernel = [pp.kernel_h, pp.kernel_w]
        self.pad = [pp.pad_h, pp.pad_w] if pp.HasField("pad_h") else [pp.pad, pp.pad]
        self.stride = ([pp.stride_h, pp.stride_w] if pp.HasField("stride_h")
                       else [pp.stride, pp.stride])
        if not self.global_pooling and any(k == 0 for k in self.kernel):
            raise self.error("filter dimensions cannot be zero, got %s" % (self.kernel,))
        if any(s == 0 for s in self.stride):
            raise self.error("stride cannot be zero, got %s" % (self.stride,))
        if self.global_pooling and (any(self.pad) or any(s != 1 for s in self.stride)):
            raise self.error("with global_pooling: true, only pad = 0 and stride = 1 are allowed")
        if any(self.pad):
            if self.method not in (_POOL.AVE, _POOL.MAX):
                raise self.error("padding is implemented only for average and max pooling")
            if not self.global_pooling and any(p >= k for p, k in zip(self.pad, self.kernel)):
                raise self.error("pad %s must be smaller than the kernel %s"
                                 % (self.pad, self.kernel))
        if self.method not in (_POOL.MAX, _POOL.AVE, _POOL.STOCHASTIC):
            raise self.error("unknown pooling method %d" % self.method)
        if len(top) > self.max_tops:
            raise self.error("only MAX pooling has a second top (the mask)")
        self._plan_key = None

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if len(shape) != 4:
            raise self.error("input must have 4 axes, corresponding to (num, channels, height, "
                             "width); got shape %s" % (shape,))
        in_hw = shape[2:]
        if self.global_pooling:
            self.kernel = list(in_hw)
        rm = self.param.pooling_param.round_mode
        out = tuple(_pooled_size(i, k, s, p, rm) for i, k, s, p in
                    zip(in_hw, self.kernel, self.stride, self.pad))
        if any(o <= 0 for o in out):
            raise self.error("the kernel %s does not fit the input %s (pad %s)"
                             % (self.kernel, in_hw, self.pad))
        key = (in_hw, tuple(self.kernel), out)
        if key != self._plan_key:
            self.geom = PoolGeometry(in_hw, self.kernel, self.stride, self.pad, out)
            self.plan = self.backend.pool_plan(self.geom)
            self._plan_key = key
        self._lead_count = shape[0] * shape[1]
        for t in top:
            t.reshape(shape[:2] + out)

    def workspace_bytes(self):
        """The padded copy of the input that a padded (or overhanging) pooling works on."""
        g = self.geom
        if not any(g.pad) and g.padded_shape == g.in_shape:
            return 0
        padded = int(np.prod(g.padded_shape, dtype=object))     # exact even when absurd
        itemsize = np.dtype(getattr(self.plan, "dtype", np.float32)).itemsize
        return self._lead_count * padded * itemsize

    def forward(self, bottom, top):
        x, y = bottom[0].dev_data, top[0].mutable_dev_data
        plan = self.plan
        if self.method == _POOL.MAX:
            plan.max_forward(x, y)
            if len(top) > 1:
                self.backend.copy(plan.mask(), top[1].mutable_dev_data)
        elif self.method == _POOL.AVE:
            plan.ave_forward(x, y)
        elif self.phase == caffe_pb2.TRAIN:
            plan.stochastic_forward_train(x, y, get_rng().random(y.shape, dtype=np.float32))
        else:
            plan.stochastic_forward_test(x, y)

    def adds_to_bottoms(self):
        # AVE's compiled backward adds a cell's shares to its value as cheaply as to zero
        return (0,) if self.method == _POOL.AVE and not self.backend.on_device else ()

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy, dx = top[0].dev_diff, bottom[0].mutable_dev_diff
        if self.method == _POOL.AVE:
            self.plan.ave_backward(dy, dx, add=0 in self.adding_bottoms)
        elif self.method == _POOL.STOCHASTIC and self.phase != caffe_pb2.TRAIN:
            self.plan.stochastic_backward_test(bottom[0].dev_data, dy, dx)
        else:
            self.plan.routed_backward(dy, dx)


@register("SPP")
class SPPLayer(Layer):
    """Spatial pyramid pooling: level l pools into 2^l x 2^l bins, flattened and concatenated."""
    device_ready = True
    exact_bottoms = 1
    exact_tops = 1

    def setup(self, bottom, top):
        sp = self.param.spp_param
        self.pyramid_height = sp.pyramid_height
        if self.pyramid_height <= 0:
            raise self.error("pyramid_height must be specified and positive")
        self._levels_key = None

    def _level_param(self, level, height, width):
        bins = 2 ** level
        lp = caffe_pb2.LayerParameter()
        lp.name = "%s_pool%d" % (self.name, level)
        lp.type = "Pooling"
        pp = lp.pooling_param
        kh = int(math.ceil(height / float(bins)))
        kw = int(math.ceil(width / float(bins)))
        pp.kernel_h, pp.kernel_w = kh, kw
        pp.pad_h, pp.pad_w = (kh * bins - height + 1) // 2, (kw * bins - width + 1) // 2
        pp.stride_h, pp.stride_w = kh, kw
        pp.pool = self.param.spp_param.pool
        return lp

    def reshape(self, bottom, top):
        from ..blob import Blob
        shape = bottom[0].shape
        if len(shape) != 4:
            raise self.error("input must have 4 axes, corresponding to (num, channels, height, "
                             "width); got shape %s" % (shape,))
        n, c, h, w = shape
        if self._levels_key != (h, w):
            self.levels = []
            for level in range(self.pyramid_height):
                pool = PoolingLayer(self._level_param(level, h, w), self.phase)
                out = Blob(())
                try:
                    pool.setup([bottom[0]], [out])
                except ValueError as exc:
                    raise self.error("pyramid level %d cannot pool a %dx%d input: %s"
                                     % (level, h, w, exc))
                self.levels.append((pool, out))
            self._levels_key = (h, w)
        sizes = []
        for pool, out in self.levels:
            pool.reshape([bottom[0]], [out])
            sizes.append(out.count // n)
        self._sizes = sizes
        if self.pyramid_height == 1:
            top[0].reshape(self.levels[0][1].shape)
        else:
            top[0].reshape((n, sum(sizes)))

    def forward(self, bottom, top):
        n = bottom[0].shape[0]
        start = 0
        for (pool, out), size in zip(self.levels, self._sizes):
            pool.forward([bottom[0]], [out])
            self.backend.axis_copy(out.dev_data.reshape(n, size),
                                   top[0].mutable_dev_data.reshape(n, -1), 1, start, True)
            start += size

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        be = self.backend
        n = bottom[0].shape[0]
        total = None
        start = 0
        for (pool, out), size in zip(self.levels, self._sizes):
            be.axis_copy(out.mutable_dev_diff.reshape(n, size), top[0].dev_diff.reshape(n, -1),
                         1, start, False)
            start += size
            pool.backward([out], [True], bottom)
            if total is None:
                total = be.copy(bottom[0].dev_diff, be.empty(bottom[0].shape))
            else:
                be.axpby(1.0, bottom[0].dev_diff, 1.0, total)
        be.copy(total, bottom[0].mutable_dev_diff)


# -- LRN ------------------------------------------------------------------------------------
@register("LRN")
class LRNLayer(Layer):
    device_ready = True
    exact_bottoms = 1
    exact_tops = 1

    def setup(self, bottom, top):
        lp = self.param.lrn_param
        self.size = lp.local_size
        if self.size % 2 == 0:
            raise self.error("LRN only supports odd values for local_size, got %d" % self.size)
        self.alpha, self.beta, self.k = lp.alpha, lp.beta, lp.k
        if lp.norm_region not in (_LRN.ACROSS_CHANNELS, _LRN.WITHIN_CHANNEL):
            raise self.error("unknown normalization region %d" % lp.norm_region)
        self.across = lp.norm_region == _LRN.ACROSS_CHANNELS

    def reshape(self, bottom, top):
        if bottom[0].num_axes != 4:
            raise self.error("input must have 4 axes, corresponding to (num, channels, height, "
                             "width); got shape %s" % (bottom[0].shape,))
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        inplace = top[0] is bottom[0]          # then top must not be written while read
        y, self.state = self.backend.lrn_forward(
            bottom[0].dev_data, self.size, self.alpha, self.beta, self.k, self.across,
            out=None if inplace else top[0].mutable_dev_data, state=getattr(self, "state", None))
        if inplace:
            self.backend.copy(y, top[0].mutable_dev_data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        self.backend.lrn_backward(
            bottom[0].dev_data, top[0].dev_data, self.state, top[0].dev_diff, self.size,
            self.alpha, self.beta, self.across, out=bottom[0].mutable_dev_diff)


# -- Im2col ---------------------------------------------------------------------------------
@register("Im2col")
class Im2colLayer(Layer):
    """Columns of convolution windows: (N, C, *in) -> (N, C*prod(kernel), *out)."""
    device_ready = True
    exact_bottoms = 1
    exact_tops = 1

    def setup(self, bottom, top):
        _read_window_geometry(self, self.param.convolution_param, bottom[0])

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if len(shape) != self.channel_axis + 1 + self.num_spatial:
            raise self.error("bottom num_axes may not change: got shape %s" % (shape,))
        c = shape[self.channel_axis]
        self.geom = ConvGeometry(c, c, shape[self.channel_axis + 1:], self.kernel, self.stride,
                                 self.pad, self.dilation)
        if any(o <= 0 for o in self.geom.out_shape):
            raise self.error("the kernel %s does not fit the input %s"
                             % (tuple(self.kernel), shape[self.channel_axis + 1:]))
        top[0].reshape(shape[:self.channel_axis] + (self.geom.col_rows,) + self.geom.out_shape)

    def forward(self, bottom, top):
        g = self.geom
        x = bottom[0].dev_data.reshape((-1, g.channels) + g.in_shape)
        self.backend.copy(self.backend.im2col(x, g), top[0].mutable_dev_data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        g = self.geom
        col = top[0].dev_diff.reshape((-1, g.col_rows) + g.out_shape)
        self.backend.copy(self.backend.col2im(col, g), bottom[0].mutable_dev_diff)


# -- Crop -----------------------------------------------------------------------------------
@register("Crop")
class CropLayer(Layer):
    """Crops bottom[0] to bottom[1]'s shape on the axes from ``axis`` on, at ``offset``."""
    device_ready = True
    exact_bottoms = 2
    exact_tops = 1
    gradient_free_bottoms = (1,)          # Caffe's Crop gives its shape reference none

    def allow_force_backward(self, bottom_index):
        return bottom_index == 0

    def reshape(self, bottom, top):
        cp = self.param.crop_param
        a, ref = bottom[0].shape, bottom[1].shape
        if len(a) != len(ref):
            raise self.error("both bottoms must have the same number of axes: %s vs %s"
                             % (a, ref))
        try:
            start = bottom[0].canonical_axis_index(cp.axis)
        except ValueError as exc:
            raise self.error("axis %d: %s" % (cp.axis, exc))
        offsets = list(cp.offset)
        if len(offsets) > 1 and start + len(offsets) != len(a):
            raise self.error("number of offset values specified (%d) must be equal to the "
                             "number of dimensions following axis (%d)"
                             % (len(offsets), len(a) - start))
        shape, slices = [], []
        for i in range(len(a)):
            if i < start:
                shape.append(a[i])
                slices.append(slice(None))
                continue
            off = 0 if not offsets else offsets[0] if len(offsets) == 1 else offsets[i - start]
            if a[i] - off < ref[i]:
                raise self.error("invalid crop parameters in dimension %d: size %d at offset "
                                 "%d cannot give %d" % (i, a[i], off, ref[i]))
            shape.append(ref[i])
            slices.append(slice(off, off + ref[i]))
        self.slices = tuple(slices)
        self.offsets = [s.start or 0 for s in slices]
        top[0].reshape(tuple(shape))

    def forward(self, bottom, top):
        self.backend.crop_copy(bottom[0].dev_data, top[0].mutable_dev_data, self.offsets, True)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            d = self.backend.fill(bottom[0].mutable_dev_diff, 0.0)
            self.backend.crop_copy(d, top[0].dev_diff, self.offsets, False)
