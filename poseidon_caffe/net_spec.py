"""Write nets in Python, pycaffe style:

    n = NetSpec()
    n.data, n.label = L.Data(source="train_lmdb", backend=P.Data.LMDB, batch_size=64, ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20,
                            weight_filler=dict(type="xavier"))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.loss = L.SoftmaxWithLoss(n.ip2, n.label)
    net_param = n.to_proto()

A keyword goes to the layer's own parameter message when that message has such a field (found
through LayerParameter's descriptor: "Convolution" -> convolution_param), otherwise to the
LayerParameter itself (param, include, loss_weight, propagate_down ...).  Keywords ending in
"param" always address the LayerParameter.  ``ntop`` sets the number of tops, ``in_place=True``
writes the top over the bottom.  Tops named by a NetSpec attribute keep that name; others are
named after their layer type and a counter (Convolution1, ...).  A layer takes its first top's
name.
"""
from collections import Counter, OrderedDict

from .proto import caffe_pb2, is_repeated

__all__ = ["NetSpec", "Top", "Function", "layers", "params", "L", "P", "to_proto",
           "param_name_dict"]

# Layer types whose parameters live in a message named after another type.
_SHARED_PARAMS = {"Deconvolution": "Convolution"}


def param_name_dict():
    """Layer type name -> its parameter field's name without the "_param" suffix, as pycaffe's
    ("Convolution" -> "convolution", "InnerProduct" -> "inner_product")."""
    names = {}
    for field in caffe_pb2.LayerParameter.DESCRIPTOR.fields:
        if field.name.endswith("_param") and field.message_type is not None:
            type_name = field.message_type.name
            if type_name.endswith("Parameter"):
                names[type_name[:-len("Parameter")]] = field.name[:-len("_param")]
    return names


def _param_fields():
    """Layer type name -> the LayerParameter field holding its parameters."""
    fields = {type_name: name + "_param" for type_name, name in param_name_dict().items()}
    for layer_type, owner in _SHARED_PARAMS.items():
        if owner in fields:
            fields[layer_type] = fields[owner]
    return fields


_PARAM_NAMES = _param_fields()


def _enum_value(field, value, where):
    if isinstance(value, str):
        enum_value = field.enum_type.values_by_name.get(value)
        if enum_value is None:
            raise ValueError("%s: '%s' is not a value of %s (one of %s)"
                             % (where, value, field.enum_type.name,
                                ", ".join(field.enum_type.values_by_name)))
        return enum_value.number
    return value


def _assign(message, name, value, where):
    """Set ``message.name`` from a Python value: dicts fill sub-messages, lists repeat."""
    field = message.DESCRIPTOR.fields_by_name.get(name)
    if field is None:
        raise AttributeError("%s: %s has no field '%s'" % (where, message.DESCRIPTOR.name, name))
    where = "%s.%s" % (where, name)
    is_message = field.message_type is not None
    is_enum = field.enum_type is not None
    if is_repeated(field):
        items = value if isinstance(value, (list, tuple)) else [value]
        container = getattr(message, name)
        for item in items:
            if is_message:
                _fill(container.add(), item, where)
            else:
                container.append(_enum_value(field, item, where) if is_enum else item)
    elif is_message:
        _fill(getattr(message, name), value, where)
    else:
        setattr(message, name, _enum_value(field, value, where) if is_enum else value)


def _fill(message, value, where):
    if isinstance(value, dict):
        message.SetInParent()
        for key, item in value.items():
            _assign(message, key, item, where)
    elif isinstance(value, type(message)):
        message.CopyFrom(value)
    else:
        raise TypeError("%s: expected a dict (or a %s) for this message field, got %r"
                        % (where, message.DESCRIPTOR.name, value))


class Top:
    """One output of a layer; becomes a named blob when the net is written."""

    def __init__(self, fn, n):
        self.fn = fn
        self.n = n

    def to_proto(self):
        """A NetParameter holding this top's layer and everything it depends on."""
        return to_proto(self)

    def _to_proto(self, layers, names, autonames):
        return self.fn._to_proto(layers, names, autonames)


class Function:
    """A layer call: its type, its input Tops and its keyword parameters."""

    def __init__(self, type_name, inputs, params):
        self.type_name = type_name
        for index, inp in enumerate(inputs):
            if not isinstance(inp, Top):
                # the type as repr() shows it, the wording pycaffe users match on
                raise TypeError("%s input %d is not a Top (type is %s)"
                                % (type_name, index, type(inp)))
        self.inputs = inputs
        self.params = dict(params)
        self.ntop = self.params.pop("ntop", 1)
        self.in_place = self.params.pop("in_place", False)
        self.tops = tuple(Top(self, n) for n in range(self.ntop))

    def _get_name(self, names, autonames):
        if self not in names:
            if self.ntop > 0:
                names[self] = self._get_top_name(self.tops[0], names, autonames)
            else:
                autonames[self.type_name] += 1
                names[self] = self.type_name + str(autonames[self.type_name])
        return names[self]

    def _get_top_name(self, top, names, autonames):
        if top not in names:
            autonames[top.fn.type_name] += 1
            names[top] = top.fn.type_name + str(autonames[top.fn.type_name])
        return names[top]

    def _to_proto(self, layers, names, autonames):
        if self in layers:
            return
        bottom_names = []
        for inp in self.inputs:
            inp._to_proto(layers, names, autonames)
            bottom_names.append(layers[inp.fn].top[inp.n])
        layer = caffe_pb2.LayerParameter()
        layer.type = self.type_name
        layer.bottom.extend(bottom_names)
        if self.in_place:
            layer.top.extend(layer.bottom)
        else:
            for top in self.tops:
                layer.top.append(self._get_top_name(top, names, autonames))
        layer.name = self._get_name(names, autonames)
        where = "%s layer %s" % (self.type_name, layer.name)
        type_param = _PARAM_NAMES.get(self.type_name)
        for key, value in self.params.items():
            if key.endswith("param") or type_param is None:
                _assign(layer, key, value, where)
                continue
            own = getattr(layer, type_param)
            if key in own.DESCRIPTOR.fields_by_name:
                _assign(own, key, value, "%s.%s" % (where, type_param))
            elif key in layer.DESCRIPTOR.fields_by_name:
                _assign(layer, key, value, where)
            else:
                raise AttributeError("%s: '%s' is a field of neither %s nor LayerParameter"
                                     % (where, key, own.DESCRIPTOR.name))
        layers[self] = layer


class NetSpec:
    """Named tops, in assignment order; to_proto() writes the layers that produce them."""

    def __init__(self):
        super().__setattr__("tops", OrderedDict())

    def __setattr__(self, name, value):
        self.tops[name] = value

    def __getattr__(self, name):
        try:
            return self.tops[name]
        except KeyError:
            raise AttributeError("NetSpec has no top named '%s'" % name) from None

    def __setitem__(self, key, value):
        self.__setattr__(key, value)

    def __getitem__(self, item):
        return self.__getattr__(item)

    def __delitem__(self, name):
        del self.tops[name]

    def keys(self):
        return list(self.tops.keys())

    def vals(self):
        return list(self.tops.values())

    def to_proto(self):
        names = {v: k for k, v in self.tops.items()}
        autonames = Counter()
        layers = OrderedDict()
        for top in self.tops.values():
            top._to_proto(layers, names, autonames)
        net = caffe_pb2.NetParameter()
        net.layer.extend(layers.values())
        return net


def to_proto(*tops):
    """A NetParameter with the layers producing ``tops`` (tops named automatically)."""
    layers = OrderedDict()
    autonames = Counter()
    for top in tops:
        top.fn._to_proto(layers, {}, autonames)
    net = caffe_pb2.NetParameter()
    net.layer.extend(layers.values())
    return net


class Layers:
    """``L.TypeName(*bottoms, **params)`` makes a layer of that type; returns its top(s)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def layer_fn(*args, **kwargs):
            fn = Function(name, args, kwargs)
            if fn.ntop == 0:
                return fn
            if fn.ntop == 1:
                return fn.tops[0]
            return fn.tops
        return layer_fn


class Parameters:
    """``P.Pooling.MAX``: enum values (and other attributes) of the PoolingParameter message."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        message = getattr(caffe_pb2, name + "Parameter", None)
        if message is None:
            raise AttributeError("caffe_pb2 has no message %sParameter" % name)

        class Param:
            def __getattr__(self, param_name):
                return getattr(message, param_name)
        return Param()


layers = L = Layers()
params = P = Parameters()
