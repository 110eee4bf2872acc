"""Layer type name -> class, as Caffe's LayerRegistry."""
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
        where = " (layer %r)" % layer_name if layer_name else ""
        raise ValueError("Unknown layer type: %r%s. Known types: %s"
                         % (type_name, where, ", ".join(layer_type_list()))) from None


def create_layer(layer_param, phase=None):
    """Build a layer from a LayerParameter; ``phase`` defaults to the parameter's own."""
    cls = layer_class(layer_param.type, layer_param.name)
    return cls(layer_param, phase)
