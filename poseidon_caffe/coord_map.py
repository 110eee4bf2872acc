"""How coordinates move through a net written with NetSpec, as pycaffe's ``caffe.coord_map``:
which input pixel lines up with which output pixel, so that a Crop layer can align an
upsampled score map with its input (fully convolutional nets).

A layer's map is (axis, scale a, shift b): output coordinate = a * input coordinate + b on the
spatial axes from ``axis`` on.  Pointwise layers map with (None, 1, 0): the identity, on any
axis.  Maps compose along a path, and inverting one maps back.
"""
import numpy as np

from .net_spec import layers as L

__all__ = ["PASS_THROUGH_LAYERS", "UndefinedMapException", "AxisMismatchException",
           "CropException", "conv_params", "crop_params", "coord_map", "compose", "inverse",
           "coord_map_from_to", "crop"]

# Layers that keep every coordinate where it is.
PASS_THROUGH_LAYERS = ["AbsVal", "BatchNorm", "Bias", "BNLL", "Clip", "Dropout", "Eltwise",
                       "ELU", "Exp", "Log", "LRN", "MVN", "Power", "PReLU", "ReLU", "Scale",
                       "Sigmoid", "Split", "Swish", "TanH", "Threshold"]

_WINDOW_LAYERS = ("Convolution", "Pooling", "Im2col")
_PARAM_MESSAGES = {"Convolution": "convolution_param", "Deconvolution": "convolution_param",
                   "Im2col": "convolution_param", "Pooling": "pooling_param",
                   "Crop": "crop_param"}


class UndefinedMapException(Exception):
    """The layer has no coordinate map (InnerProduct, global pooling, ...): the walk stops."""


class AxisMismatchException(Exception):
    """Two maps act on different axes and cannot be composed."""


class CropException(AssertionError):
    """``crop`` cannot align the tops (different scales, a negative or fractional offset).
    An AssertionError, as pycaffe raises."""


def _layer_params(fn):
    """A layer call's keyword parameters, with those given inside its parameter message
    (``convolution_param=dict(...)``) merged over the flat ones."""
    params = dict(fn.params)
    nested = params.get(_PARAM_MESSAGES.get(fn.type_name, ""))
    if isinstance(nested, dict):
        params.update(nested)
    return params


def _per_axis(params, name, default):
    """A spatial setting as an array, one value per axis: ``name`` (a number or list), or the
    legacy ``name_h`` / ``name_w`` pair of 2-D nets."""
    if name + "_h" in params or name + "_w" in params:
        return np.array([params.get(name + "_h", default), params.get(name + "_w", default)])
    value = params.get(name, default)
    if isinstance(value, (list, tuple)) and len(value) == 0:
        value = default
    return np.array(value, ndmin=1)


def conv_params(fn):
    """(axis, stride, kernel extent, pad) of a Convolution, Deconvolution, Im2col or Pooling
    call, each per spatial axis; the extent counts dilation ((k - 1) * d + 1)."""
    params = _layer_params(fn)
    if fn.type_name == "Pooling" and params.get("global_pooling"):
        raise UndefinedMapException("global pooling collapses the spatial axes")
    if ("kernel_h" in params) != ("kernel_w" in params):
        raise ValueError("%s call: kernel_h and kernel_w are given together" % fn.type_name)
    if "kernel_h" in params:
        kernel = np.array([params["kernel_h"], params["kernel_w"]])
    elif "kernel_size" in params:
        kernel = np.array(params["kernel_size"], ndmin=1)
    else:
        raise UndefinedMapException("%s call without kernel_size" % fn.type_name)
    dilation = np.array(params.get("dilation", 1), ndmin=1) if fn.type_name != "Pooling" else 1
    axis = params.get("axis", 1) if fn.type_name != "Pooling" else 1
    return (axis, _per_axis(params, "stride", 1), (kernel - 1) * dilation + 1,
            _per_axis(params, "pad", 0))


def crop_params(fn):
    """(axis, offset) of a Crop call, with Crop's defaults (axis 2, offset 0)."""
    params = _layer_params(fn)
    return params.get("axis", 2), np.array(params.get("offset", 0), ndmin=1)


def coord_map(fn):
    """The (axis, scale, shift) map of one layer call, from its input to its output."""
    if fn.type_name in _WINDOW_LAYERS:
        axis, stride, extent, pad = conv_params(fn)
        # output i looks at the window centred on input i * stride - pad + (extent - 1) / 2
        return axis, 1 / stride, (pad - (extent - 1) / 2) / stride
    if fn.type_name == "Deconvolution":
        axis, stride, extent, pad = conv_params(fn)
        return axis, stride, (extent - 1) / 2 - pad
    if fn.type_name in PASS_THROUGH_LAYERS:
        return None, 1, 0
    if fn.type_name == "Crop":
        axis, offset = crop_params(fn)
        # the map's axis is the last non-spatial one, as for the window layers
        return axis - 1, 1, -offset
    raise UndefinedMapException("no coordinate map for %s layers" % fn.type_name)


def compose(base_map, next_map):
    """The map doing ``next_map`` first, then ``base_map``: scales multiply, the inner shift
    is scaled by the outer scale."""
    ax1, a1, b1 = base_map
    ax2, a2, b2 = next_map
    if ax1 is None:
        axis = ax2
    elif ax2 is None or ax1 == ax2:
        axis = ax1
    else:
        raise AxisMismatchException("maps on axis %s and axis %s do not compose" % (ax1, ax2))
    return axis, a1 * a2, a1 * b2 + b1


def inverse(coord_map):
    """The map undoing ``coord_map``."""
    axis, a, b = coord_map
    return axis, 1 / a, -b / a


def _mapped_bottoms(top):
    # a Crop's second bottom only lends its shape; coordinates come from the first
    inputs = top.fn.inputs
    return inputs[:1] if top.fn.type_name == "Crop" else inputs


def _ancestor_maps(top):
    """Every top reachable backwards from ``top`` through mappable layers, with the map from
    that ancestor's coordinates to ``top``'s, in breadth-first order."""
    maps = {top: (None, 1, 0)}
    order = [top]
    seen = {top}
    for current in order:
        try:
            step = coord_map(current.fn)
        except UndefinedMapException:
            continue
        for bottom in _mapped_bottoms(current):
            maps[bottom] = compose(maps[current], step)
            if bottom not in seen:
                seen.add(bottom)
                order.append(bottom)
    return maps, order


def coord_map_from_to(top_from, top_to):
    """The map from ``top_from``'s coordinates to ``top_to``'s: both are walked back to their
    nearest common ancestor, and the path up to ``top_from`` is inverted. RuntimeError when no
    spatial path joins them."""
    from_maps, _ = _ancestor_maps(top_from)
    to_maps, order = _ancestor_maps(top_to)
    for top in order:
        if top in from_maps:
            return compose(to_maps[top], inverse(from_maps[top]))
    raise RuntimeError("Could not compute map between tops; are they connected by spatial "
                       "layers?")


def crop(top_from, top_to):
    """A Crop layer cutting ``top_from`` to the extent of ``top_to``, with the axis and offsets
    their coordinate map gives."""
    axis, a, b = coord_map_from_to(top_from, top_to)
    a, b = np.asarray(a), np.asarray(b)
    if not np.all(a == 1):
        raise CropException("scale mismatch on crop (a = %s)" % a)
    if not np.all(b <= 0):
        raise CropException("cannot crop negative offset (b = %s)" % b)
    if not np.all(np.round(b) == b):
        raise CropException("cannot crop noninteger offset (b = %s)" % b)
    first = 2 if axis is None else axis + 1          # the first cropped axis
    offsets = [int(v) for v in np.atleast_1d(-np.round(b))]
    return L.Crop(top_from, top_to, crop_param=dict(axis=int(first), offset=offsets))
