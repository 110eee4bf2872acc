"""Layer type name -> class, as Caffe's LayerRegistry."""
import difflib

from ..backend import get_backend
from .base import LayerError

_REGISTRY = {}


def register(type_name):
    def wrap(cls):
        if type_name in _REGISTRY and _REGISTRY[type_name] is not cls:
            raise ValueError("layer type %r registered twice" % type_name)
        cls.type = type_name
        _REGISTRY[type_name] = cls
        return cls
    return wrap


def layer_type_list():
    return sorted(_REGISTRY)


def layer_class(type_name, layer_name=None):
    try:
        return _REGISTRY[type_name]
    except KeyError:
        pass
    raise LayerError(_unknown_message([(type_name, [layer_name] if layer_name else [])]))


def check_types(layer_params):
    """Refuse a net with unknown layer types, naming every one in a single error (each with
    the layers of that type and its close matches), as a user porting a model wants."""
    unknown = {}
    for lp in layer_params:
        if lp.type not in _REGISTRY:
            unknown.setdefault(lp.type, []).append(lp.name)
    if unknown:
        raise LayerError(_unknown_message(list(unknown.items())))


def _unknown_message(unknown):
    """'Unknown layer type: 'X' (layer 'x'); did you mean 'Y'? ... Known types: ...'"""
    # type names are CamelCase; a wrong case or a typo is the usual mistake
    by_lower = {name.lower(): name for name in _REGISTRY}
    parts = []
    for type_name, layers in unknown:
        where = (" (layer%s %s)" % ("s" if len(layers) > 1 else "",
                                    ", ".join(repr(n) for n in layers))) if layers else ""
        close = difflib.get_close_matches(type_name.lower(), list(by_lower), n=3, cutoff=0.75)
        # a known type extended by a suffix (ConvolutionDepthwise) is its likely stand-in
        close += sorted((n for n in by_lower if len(n) >= 4 and type_name.lower().startswith(n)
                         and n not in close), key=len, reverse=True)[:1]
        hint = ("; did you mean %s?" % " or ".join(repr(by_lower[c]) for c in close)
                if close else "")
        parts.append("%r%s%s" % (type_name, where, hint))
    return "Unknown layer type%s: %s. Known types: %s" % (
        "s" if len(parts) > 1 else "", ", ".join(parts), ", ".join(layer_type_list()))


def create_layer(layer_param, phase=None):
    """Build a layer from a LayerParameter; ``phase`` defaults to the parameter's own."""
    cls = layer_class(layer_param.type, layer_param.name)
    if not cls.device_ready and get_backend().on_device:
        # no hidden host fallback: a net runs wholly on the device or says which layer cannot
        raise LayerError("layer %r (type %s) has no GPU implementation yet; run it on the CPU"
                         % (layer_param.name, layer_param.type))
    return cls(layer_param, phase)
