"""Layer family: common blob plumbing and arithmetic: Concat, Slice, Split, Flatten, Reshape,
Eltwise, Filter, BatchReindex, Tile, Reduction, ArgMax, Silence and Parameter."""
import numpy as np

from .base import Layer
from .registry import register
from ..blob import Blob
from ..proto import caffe_pb2


def _legacy_axis(layer, bottom, msg_param, legacy_name):
    """The axis from ``axis`` or the legacy ``concat_dim`` / ``slice_dim`` (one, not both)."""
    if msg_param.HasField(legacy_name):
        if msg_param.HasField("axis"):
            raise layer.error("Either axis or %s should be specified; not both." % legacy_name)
        axis = int(getattr(msg_param, legacy_name))
        if axis >= bottom.num_axes:
            raise layer.error("%s %d out of range for a bottom of shape %s"
                              % (legacy_name, axis, bottom.shape))
        return axis
    try:
        return bottom.canonical_axis_index(msg_param.axis)
    except ValueError as exc:
        raise layer.error(str(exc)) from None


@register("Concat")
class ConcatLayer(Layer):
    device_ready = True
    min_bottoms = 1
    exact_tops = 1

    def reshape(self, bottom, top):
        axis = _legacy_axis(self, bottom[0], self.param.concat_param, "concat_dim")
        first = bottom[0].shape
        for i, b in enumerate(bottom[1:], 1):
            if b.num_axes != len(first):
                raise self.error("All inputs must have the same #axes: bottom 0 is %s, "
                                 "bottom %d is %s" % (first, i, b.shape))
            if b.shape[:axis] != first[:axis] or b.shape[axis + 1:] != first[axis + 1:]:
                raise self.error("All inputs must have the same shape, except at concat_axis "
                                 "%d: bottom 0 is %s, bottom %d is %s" % (axis, first, i, b.shape))
        self.axis = axis
        self.sizes = [b.shape[axis] for b in bottom]
        shape = list(first)
        shape[axis] = sum(self.sizes)
        top[0].reshape(shape)

    def forward(self, bottom, top):
        whole = top[0].mutable_dev_data
        offset = 0
        for b, size in zip(bottom, self.sizes):
            self.backend.axis_copy(b.dev_data, whole, self.axis, offset, True)
            offset += size

    def backward(self, top, propagate_down, bottom):
        whole = top[0].dev_diff
        offset = 0
        for i, b in enumerate(bottom):
            if propagate_down[i]:
                self.backend.axis_copy(b.mutable_dev_diff, whole, self.axis, offset, False)
            offset += self.sizes[i]


@register("Slice")
class SliceLayer(Layer):
    device_ready = True
    exact_bottoms = 1
    min_tops = 1

    def reshape(self, bottom, top):
        p = self.param.slice_param
        axis = _legacy_axis(self, bottom[0], p, "slice_dim")
        length = bottom[0].shape[axis]
        if len(p.slice_point):
            if len(p.slice_point) != len(top) - 1:
                raise self.error("needs one slice_point fewer than tops: %d slice points for "
                                 "%d tops" % (len(p.slice_point), len(top)))
            if len(top) > length:
                raise self.error("cannot cut axis %d of length %d into %d tops"
                                 % (axis, length, len(top)))
            bounds = [0] + [int(s) for s in p.slice_point] + [length]
            for a, b in zip(bounds, bounds[1:]):
                if b <= a:
                    raise self.error("slice_point values must increase strictly within (0, %d); "
                                     "got %s" % (length, list(p.slice_point)))
        else:
            if length % len(top):
                raise self.error("Number of top blobs (%d) should evenly divide input slice "
                                 "axis (%d)" % (len(top), length))
            step = length // len(top)
            bounds = [i * step for i in range(len(top) + 1)]
        self.axis = axis
        self.bounds = bounds
        for t, a, b in zip(top, bounds, bounds[1:]):
            shape = list(bottom[0].shape)
            shape[axis] = b - a
            t.reshape(shape)

    def _index(self, i):
        return tuple([slice(None)] * self.axis + [slice(self.bounds[i], self.bounds[i + 1])])

    def forward(self, bottom, top):
        whole = bottom[0].dev_data
        for i, t in enumerate(top):
            self.backend.axis_copy(t.mutable_dev_data, whole, self.axis, self.bounds[i], False)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        whole = bottom[0].mutable_dev_diff
        for i, t in enumerate(top):
            self.backend.axis_copy(t.dev_diff, whole, self.axis, self.bounds[i], True)


@register("Split")
class SplitLayer(Layer):
    """Every top shares the bottom's data; the bottom's gradient is the sum of the tops'."""
    device_ready = True
    exact_bottoms = 1
    min_tops = 1

    def reshape(self, bottom, top):
        for t in top:
            if t is bottom[0]:
                raise self.error("Split Layer does not allow in-place computation.")
            t.reshape(bottom[0].shape)
            t.share_data(bottom[0])

    def forward(self, bottom, top):
        for t in top:
            t.share_data(bottom[0])

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        be = self.backend
        diff = be.copy(top[0].dev_diff, bottom[0].mutable_dev_diff)
        for t in top[1:]:
            be.axpby(1.0, t.dev_diff, 1.0, diff)


def _no_in_place(layer, bottom, top):
    if top[0] is bottom[0]:
        raise layer.error("%s layer does not allow in-place computation." % layer.type)


class _ViewLayer(Layer):
    """A new shape over the bottom's data (shared); the gradient is copied back unchanged."""
    device_ready = True
    exact_bottoms = 1
    exact_tops = 1

    def forward(self, bottom, top):
        top[0].share_data(bottom[0])

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.backend.copy(top[0].dev_diff, bottom[0].mutable_dev_diff)


@register("Flatten")
class FlattenLayer(_ViewLayer):
    def reshape(self, bottom, top):
        _no_in_place(self, bottom, top)
        p = self.param.flatten_param
        try:
            start = bottom[0].canonical_axis_index(p.axis)
            end = bottom[0].canonical_axis_index(p.end_axis)
        except ValueError as exc:
            raise self.error(str(exc)) from None
        shape = bottom[0].shape
        top[0].reshape(shape[:start] + (bottom[0].count_axes(start, end + 1),) + shape[end + 1:])
        top[0].share_data(bottom[0])


@register("Reshape")
class ReshapeLayer(_ViewLayer):
    """reshape_param.shape over axes [axis, axis + num_axes): 0 copies the bottom's dimension,
    -1 is inferred from the count."""

    def setup(self, bottom, top):
        _no_in_place(self, bottom, top)
        dims = [int(d) for d in self.param.reshape_param.shape.dim]
        self.copy_axes = [i for i, d in enumerate(dims) if d == 0]
        inferred = [i for i, d in enumerate(dims) if d == -1]
        if len(inferred) > 1:
            raise self.error("new shape contains multiple -1 dims; at most a single (1) value "
                             "of -1 may be specified (shape %s)" % dims)
        if any(d < -1 for d in dims):
            raise self.error("new shape %s has a dimension below -1" % dims)
        self.inferred_axis = inferred[0] if inferred else -1
        self.dims = dims
        self.constant_count = int(np.prod([d for d in dims if d > 0], dtype=np.int64))

    def reshape(self, bottom, top):
        p = self.param.reshape_param
        b = bottom[0]
        start = p.axis if p.axis >= 0 else b.num_axes + p.axis + 1
        if not 0 <= start <= b.num_axes:
            raise self.error("axis %d out of range for a bottom of shape %s" % (p.axis, b.shape))
        if p.num_axes < -1:
            raise self.error("num_axes must be >= 0, or -1 for all (got %d)" % p.num_axes)
        end = b.num_axes if p.num_axes == -1 else start + p.num_axes
        if end > b.num_axes:
            raise self.error("end_axis = axis + num_axes is out of range: %d + %d for a bottom "
                             "of shape %s" % (start, p.num_axes, b.shape))
        shape = list(b.shape[:start]) + list(self.dims) + list(b.shape[end:])
        for i in self.copy_axes:
            if start + i >= b.num_axes:
                raise self.error("new shape contains a 0, but there was no corresponding bottom "
                                 "axis to copy (axis %d of bottom shape %s)" % (start + i, b.shape))
            shape[start + i] = b.shape[start + i]
        if self.inferred_axis >= 0:
            explicit = self.constant_count * b.count_axes(0, start) * b.count_axes(end)
            for i in self.copy_axes:
                explicit *= shape[start + i]
            if explicit == 0 or b.count % explicit:
                raise self.error("bottom count (%d) must be divisible by the product of the "
                                 "specified dimensions (%d)" % (b.count, explicit))
            shape[start + self.inferred_axis] = b.count // explicit
        count = int(np.prod(shape, dtype=np.int64))
        if count != b.count:
            raise self.error("output count must match input count: shape %s has %d, the bottom "
                             "%s has %d" % (tuple(shape), count, b.shape, b.count))
        top[0].reshape(shape)
        top[0].share_data(b)


_Elt = caffe_pb2.EltwiseParameter
_ELT_OPS = {_Elt.PROD: "prod", _Elt.SUM: "sum", _Elt.MAX: "max"}


@register("Eltwise")
class EltwiseLayer(Layer):
    device_ready = True
    min_bottoms = 2
    exact_tops = 1

    def setup(self, bottom, top):
        p = self.param.eltwise_param
        self.op = p.operation
        if len(p.coeff) not in (0, len(bottom)):
            raise self.error("Eltwise Layer takes one coefficient per bottom blob "
                             "(%d coefficients, %d bottoms)" % (len(p.coeff), len(bottom)))
        if self.op == _Elt.PROD and len(p.coeff):
            raise self.error("Eltwise layer only takes coefficients for summation.")
        self.coeffs = [float(c) for c in p.coeff] or [1.0] * len(bottom)
        self.stable_prod_grad = p.stable_prod_grad

    def reshape(self, bottom, top):
        for i, b in enumerate(bottom[1:], 1):
            if b.shape != bottom[0].shape:
                raise self.error("all bottoms must have the same shape: bottom 0 is %s, bottom "
                                 "%d is %s" % (bottom[0].shape, i, b.shape))
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        if self.op not in _ELT_OPS:
            raise self.error("unknown eltwise operation %d" % self.op)
        self.argmax = self.backend.eltwise_forward(
            _ELT_OPS[self.op], [b.dev_data for b in bottom], self.coeffs,
            top[0].mutable_dev_data)

    def backward(self, top, propagate_down, bottom):
        dy = top[0].dev_diff
        xs = [b.dev_data for b in bottom]
        for i, b in enumerate(bottom):
            if propagate_down[i]:
                self.backend.eltwise_backward(_ELT_OPS[self.op], i, xs, top[0].dev_data, dy,
                                              b.mutable_dev_diff, self.coeffs, self.argmax,
                                              self.stable_prod_grad)


@register("Filter")
class FilterLayer(Layer):
    """Keeps the items (along axis 0) whose selector, the last bottom, is non-zero; one top per
    data bottom. The gradient returns to the kept items; the others get zero."""
    device_ready = True
    min_bottoms = 2
    min_tops = 1

    def allow_force_backward(self, bottom_index):
        return bottom_index != len(self.param.bottom) - 1

    def setup(self, bottom, top):
        if len(top) != len(bottom) - 1:
            raise self.error("needs one top per data bottom (the selector is the last bottom): "
                             "%d bottoms, %d tops" % (len(bottom), len(top)))
        self.first_reshape = True

    def reshape(self, bottom, top):
        selector = bottom[-1]
        if selector.count != selector.shape[0]:
            raise self.error("Selector blob dimensions must be singletons (1), except the "
                             "first; got %s" % (selector.shape,))
        for i, b in enumerate(bottom[:-1]):
            if b.shape[0] != selector.shape[0]:
                raise self.error("Each bottom should have the same 0th dimension as the selector "
                                 "blob: bottom %d is %s, selector %s"
                                 % (i, b.shape, selector.shape))
        # the top's shape depends on the selector's values: read them (as Caffe does)
        values = self.backend.to_host(selector.dev_data)
        self.keep = np.nonzero(values.reshape(-1) != 0)[0]
        # at net setup the selector holds no data yet: size the tops for every item
        n = selector.shape[0] if self.first_reshape else int(self.keep.size)
        self.first_reshape = False
        for t, b in zip(top, bottom):
            t.reshape((n,) + b.shape[1:])

    def forward(self, bottom, top):
        self.first_reshape = False
        self.reshape(bottom, top)
        for t, b in zip(top, bottom):
            self.backend.gather_rows(b.dev_data, self.keep, t.mutable_dev_data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[-1]:
            raise self.error("Layer cannot backpropagate to filter index inputs")
        for i, t in enumerate(top):
            if propagate_down[i]:
                self.backend.scatter_rows(t.dev_diff, self.keep, bottom[i].mutable_dev_diff,
                                          unique=True)


@register("BatchReindex")
class BatchReindexLayer(Layer):
    """top[i] = bottom[0][index[i]]: items picked (and repeated) along axis 0."""
    device_ready = True
    exact_bottoms = 2
    exact_tops = 1

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1

    def reshape(self, bottom, top):
        if bottom[1].num_axes != 1:
            raise self.error("the index bottom must have one axis; got %s" % (bottom[1].shape,))
        top[0].reshape((bottom[1].shape[0],) + bottom[0].shape[1:])

    def _indices(self, bottom):
        # read on the host to be checked, as Caffe does (a few values)
        idx = self.backend.to_host(bottom[1].dev_data).astype(np.int64)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= bottom[0].shape[0]):
            raise self.error("Index specified for reindex layer was greater than batch size "
                             "or negative: indices %s for %d items"
                             % (idx.tolist(), bottom[0].shape[0]))
        return idx

    def forward(self, bottom, top):
        self.backend.gather_rows(bottom[0].dev_data, self._indices(bottom),
                                 top[0].mutable_dev_data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("Cannot backprop to index.")
        if not propagate_down[0]:
            return
        self.backend.scatter_rows(top[0].dev_diff, self._indices(bottom),
                                  bottom[0].mutable_dev_diff)


@register("Tile")
class TileLayer(Layer):
    """Repeats the block of axes [axis, end) ``tiles`` times."""
    device_ready = True
    exact_bottoms = 1
    exact_tops = 1

    def reshape(self, bottom, top):
        p = self.param.tile_param
        if not p.HasField("tiles"):
            raise self.error("Number of tiles must be specified (tile_param.tiles)")
        if p.tiles <= 0:
            raise self.error("Number of tiles must be positive.")
        self.axis = bottom[0].canonical_axis_index(p.axis)
        self.outer = bottom[0].count_axes(0, self.axis)
        self.inner = bottom[0].count_axes(self.axis)
        self.tiles = int(p.tiles)
        shape = list(bottom[0].shape)
        shape[self.axis] *= self.tiles
        top[0].reshape(shape)

    def forward(self, bottom, top):
        self.backend.tile_forward(bottom[0].dev_data.reshape(self.outer, 1, self.inner),
                                  top[0].mutable_dev_data.reshape(self.outer, self.tiles,
                                                                  self.inner))

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.backend.tile_backward(
                top[0].dev_diff.reshape(self.outer, self.tiles, self.inner),
                bottom[0].mutable_dev_diff.reshape(self.outer, 1, self.inner))


_Red = caffe_pb2.ReductionParameter
_REDUCTIONS = {_Red.SUM: "SUM", _Red.ASUM: "ASUM", _Red.SUMSQ: "SUMSQ", _Red.MEAN: "MEAN"}


@register("Reduction")
class ReductionLayer(Layer):
    """Reduces every axis from ``axis`` on (SUM, ASUM, SUMSQ or MEAN), then scales by coeff;
    the top keeps the axes before ``axis`` (a 0-axis blob for axis 0)."""
    device_ready = True
    exact_bottoms = 1
    exact_tops = 1

    def reshape(self, bottom, top):
        p = self.param.reduction_param
        self.axis = bottom[0].canonical_axis_index(p.axis)
        self.num = bottom[0].count_axes(0, self.axis)
        self.dim = bottom[0].count_axes(self.axis)
        self.op = p.operation
        self.coeff = float(p.coeff)
        top[0].reshape(bottom[0].shape[:self.axis])

    def forward(self, bottom, top):
        if self.op not in _REDUCTIONS:
            raise self.error("unknown reduction operation %d" % self.op)
        self.backend.reduction_forward(bottom[0].dev_data.reshape(self.num, self.dim),
                                       _REDUCTIONS[self.op], self.coeff,
                                       top[0].mutable_dev_data.reshape(self.num))

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        self.backend.reduction_backward(bottom[0].dev_data.reshape(self.num, self.dim),
                                        top[0].dev_diff, _REDUCTIONS[self.op],
                                        self.coeff, bottom[0].mutable_dev_diff)


@register("ArgMax")
class ArgMaxLayer(Layer):
    """Indices (and with out_max_val, values) of the top_k largest entries, per item over the
    flattened item (shape N x 1|2 x top_k) or along ``axis`` (that axis becomes top_k).
    Ties rank the larger index first."""
    device_ready = True
    exact_bottoms = 1
    exact_tops = 1

    def setup(self, bottom, top):
        p = self.param.argmax_param
        self.top_k = int(p.top_k)
        self.out_max_val = p.out_max_val
        self.has_axis = p.HasField("axis")
        if self.top_k < 1:
            raise self.error("top k must not be less than 1.")
        if self.has_axis:
            self.axis = bottom[0].canonical_axis_index(p.axis)
            if self.top_k > bottom[0].shape[self.axis]:
                raise self.error("top_k must be less than or equal to the dimension of the axis "
                                 "(%d > %d)" % (self.top_k, bottom[0].shape[self.axis]))
        elif self.top_k > bottom[0].count_axes(1):
            raise self.error("top_k must be less than or equal to the dimension of the flattened "
                             "bottom blob per instance (%d > %d)"
                             % (self.top_k, bottom[0].count_axes(1)))

    def reshape(self, bottom, top):
        if self.has_axis:
            shape = list(bottom[0].shape)
            shape[self.axis] = self.top_k
        else:
            shape = [1] * max(bottom[0].num_axes, 3)
            shape[0] = bottom[0].shape[0]
            shape[2] = self.top_k
            if self.out_max_val:
                shape[1] = 2
        top[0].reshape(shape)

    def forward(self, bottom, top):
        self.backend.argmax(bottom[0].dev_data, self.axis if self.has_axis else None,
                            self.top_k, self.out_max_val, top[0].mutable_dev_data)


@register("Silence")
class SilenceLayer(Layer):
    """Consumes bottoms nobody else reads, so the net prints nothing for them."""
    device_ready = True
    min_bottoms = 1
    exact_tops = 0

    def reshape(self, bottom, top):
        """No tops to shape."""

    def forward(self, bottom, top):
        """Nothing to compute."""

    def backward(self, top, propagate_down, bottom):
        for i, b in enumerate(bottom):
            if propagate_down[i]:
                self.backend.fill(b.mutable_dev_diff, 0.0)


@register("Parameter")
class ParameterLayer(Layer):
    """One learnable blob of parameter_param.shape (zeros unless loaded), offered as the top."""
    device_ready = True
    exact_bottoms = 0
    exact_tops = 1

    def setup(self, bottom, top):
        shape = tuple(int(d) for d in self.param.parameter_param.shape.dim)
        if not self.blobs:
            self.blobs = [Blob(shape)]
            self.param_propagate_down = [True]
        elif self.blobs[0].shape != shape:
            raise self.error("the loaded parameter has shape %s, parameter_param.shape is %s"
                             % (self.blobs[0].shape, shape))
        top[0].reshape(shape)

    def reshape(self, bottom, top):
        top[0].reshape(self.blobs[0].shape)

    def forward(self, bottom, top):
        top[0].share_data(self.blobs[0])

    def backward(self, top, propagate_down, bottom):
        if self.param_propagate_down[0]:
            self.backend.axpby(1.0, top[0].dev_diff, 1.0, self.blobs[0].mutable_dev_diff)
