"""Legacy nets and solvers -> the current format, with Caffe's upgrade rules.

Nets, oldest first:
  V0  `layers { layer { type: "conv" kernelsize: 5 ... } bottom: ... }`  -> V1
  V1  `layers { type: CONVOLUTION blobs_lr: 1 weight_decay: 1 ... }`     -> `layer { type: "Convolution"
      param { lr_mult decay_mult } }`
  data-layer transformation fields (scale, mean_file, crop_size, mirror) -> transform_param
  net-level `input` / `input_dim` / `input_shape`                         -> an "Input" layer
  BatchNorm layers declaring three (statistics) param specs               -> param specs removed
Solvers: the enum `solver_type` -> the string `type`.

Each step logs as Caffe logs it.  Upgrades happen in place; the functions return whether anything
changed.  Problems Caffe treats as fatal raise UpgradeError.  The io readers call these; the
``upgrade-net`` / ``upgrade-solver`` commands (tools/upgrade.py) read files as written through
io and upgrade them here, so this module needs nothing of io.
"""
from . import log
from .proto import caffe_pb2

__all__ = ["UpgradeError", "upgrade_net", "upgrade_solver", "net_needs_upgrade"]

V1 = caffe_pb2.V1LayerParameter


class UpgradeError(ValueError):
    """A legacy definition that cannot be upgraded."""


# ---------------------------------------------------------------------------
# V0 -> V1
# ---------------------------------------------------------------------------

_V0_TYPES = {
    "accuracy": V1.ACCURACY, "bnll": V1.BNLL, "concat": V1.CONCAT, "conv": V1.CONVOLUTION,
    "data": V1.DATA, "dropout": V1.DROPOUT, "euclidean_loss": V1.EUCLIDEAN_LOSS,
    "flatten": V1.FLATTEN, "hdf5_data": V1.HDF5_DATA, "hdf5_output": V1.HDF5_OUTPUT,
    "im2col": V1.IM2COL, "images": V1.IMAGE_DATA, "infogain_loss": V1.INFOGAIN_LOSS,
    "innerproduct": V1.INNER_PRODUCT, "lrn": V1.LRN,
    "multinomial_logistic_loss": V1.MULTINOMIAL_LOGISTIC_LOSS, "pool": V1.POOLING,
    "relu": V1.RELU, "sigmoid": V1.SIGMOID, "softmax": V1.SOFTMAX,
    "softmax_loss": V1.SOFTMAX_LOSS, "split": V1.SPLIT, "tanh": V1.TANH,
    "window_data": V1.WINDOW_DATA,
}

# V0 field -> {V0 layer type: (V1 parameter message, field, how)}; how is "set", "add"
# (repeated in the current message) or "copy" (a sub-message).
_CONV_IP = lambda field, how="set": {"conv": ("convolution_param", field, how),  # noqa: E731
                                     "innerproduct": ("inner_product_param", field, how)}
_V0_FIELDS = {
    "num_output": _CONV_IP("num_output"),
    "biasterm": _CONV_IP("bias_term"),
    "weight_filler": _CONV_IP("weight_filler", "copy"),
    "bias_filler": _CONV_IP("bias_filler", "copy"),
    "pad": {"conv": ("convolution_param", "pad", "add"), "pool": ("pooling_param", "pad", "set")},
    "kernelsize": {"conv": ("convolution_param", "kernel_size", "add"),
                   "pool": ("pooling_param", "kernel_size", "set")},
    "group": {"conv": ("convolution_param", "group", "set")},
    "stride": {"conv": ("convolution_param", "stride", "add"),
               "pool": ("pooling_param", "stride", "set")},
    "pool": {"pool": ("pooling_param", "pool", "set")},
    "dropout_ratio": {"dropout": ("dropout_param", "dropout_ratio", "set")},
    "local_size": {"lrn": ("lrn_param", "local_size", "set")},
    "alpha": {"lrn": ("lrn_param", "alpha", "set")},
    "beta": {"lrn": ("lrn_param", "beta", "set")},
    "k": {"lrn": ("lrn_param", "k", "set")},
    "source": {"data": ("data_param", "source", "set"),
               "hdf5_data": ("hdf5_data_param", "source", "set"),
               "images": ("image_data_param", "source", "set"),
               "window_data": ("window_data_param", "source", "set"),
               "infogain_loss": ("infogain_loss_param", "source", "set")},
    "batchsize": {"data": ("data_param", "batch_size", "set"),
                  "hdf5_data": ("hdf5_data_param", "batch_size", "set"),
                  "images": ("image_data_param", "batch_size", "set"),
                  "window_data": ("window_data_param", "batch_size", "set")},
    "rand_skip": {"data": ("data_param", "rand_skip", "set"),
                  "images": ("image_data_param", "rand_skip", "set")},
    "shuffle_images": {"images": ("image_data_param", "shuffle", "set")},
    "new_height": {"images": ("image_data_param", "new_height", "set")},
    "new_width": {"images": ("image_data_param", "new_width", "set")},
    "concat_dim": {"concat": ("concat_param", "concat_dim", "set")},
    "det_fg_threshold": {"window_data": ("window_data_param", "fg_threshold", "set")},
    "det_bg_threshold": {"window_data": ("window_data_param", "bg_threshold", "set")},
    "det_fg_fraction": {"window_data": ("window_data_param", "fg_fraction", "set")},
    "det_context_pad": {"window_data": ("window_data_param", "context_pad", "set")},
    "det_crop_mode": {"window_data": ("window_data_param", "crop_mode", "set")},
    "hdf5_output_param": {"hdf5_output": ("hdf5_output_param", None, "copy")},
}
# Transformation fields apply to any V0 layer type.
_V0_TRANSFORM = {"scale": "scale", "meanfile": "mean_file", "cropsize": "crop_size",
                 "mirror": "mirror"}


def _needs_v0_upgrade(net):
    return any(l.HasField("layer") for l in net.layers)


def _fold_padding_layers(net):
    """Remove V0 "padding" layers, moving their pad into the conv/pool layer that reads them."""
    producer = {name: None for name in net.input}
    kept = []
    for i, conn in enumerate(net.layers):
        v0 = conn.layer
        if v0.type != "padding":
            kept.append(_copy(conn))
        for j, blob in enumerate(conn.bottom):
            if blob not in producer:
                raise UpgradeError("unknown blob input %s to layer %s" % (blob, v0.name or i))
            src = producer[blob]
            if src is None or net.layers[src].layer.type != "padding":
                continue
            pad_layer = net.layers[src]
            if v0.type not in ("conv", "pool"):
                raise UpgradeError("padding layer %s feeds layer %s of type %s; only conv and "
                                   "pool layers can absorb padding"
                                   % (pad_layer.layer.name, v0.name, v0.type))
            if len(conn.bottom) != 1 or len(pad_layer.bottom) != 1 or len(pad_layer.top) != 1:
                raise UpgradeError("padding layer %s and the layer %s it feeds must each have "
                                   "one input and one output" % (pad_layer.layer.name, v0.name))
            kept[-1].layer.pad = pad_layer.layer.pad
            kept[-1].bottom[j] = pad_layer.bottom[0]
        for blob in conn.top:
            producer[blob] = i
    del net.layers[:]
    net.layers.extend(kept)


def _copy(message):
    out = type(message)()
    out.CopyFrom(message)
    return out


def _upgrade_v0_layer(conn, out):
    """One V0 layer -> V1 layer; returns False when some field had no place to go."""
    ok = True
    out.bottom.extend(conn.bottom)
    out.top.extend(conn.top)
    v0 = conn.layer
    kind = v0.type
    if v0.HasField("name"):
        out.name = v0.name
    if v0.HasField("type"):
        if kind not in _V0_TYPES:
            raise UpgradeError("unknown V0 layer type '%s' in layer %s" % (kind, v0.name))
        out.type = _V0_TYPES[kind]
    out.blobs.extend(v0.blobs)
    out.blobs_lr.extend(v0.blobs_lr)
    out.weight_decay.extend(v0.weight_decay)
    for fd, value in v0.ListFields():
        name = fd.name
        if name in _V0_TRANSFORM:
            setattr(out.transform_param, _V0_TRANSFORM[name], value)
            continue
        if name not in _V0_FIELDS:
            continue
        target = _V0_FIELDS[name].get(kind)
        if target is None:
            log.error("Unknown parameter %s for layer type %s", name, kind)
            ok = False
            continue
        param_name, field, how = target
        param = getattr(out, param_name)
        if how == "copy":
            (getattr(param, field) if field else param).CopyFrom(value)
        elif how == "add":
            getattr(param, field).append(value)
        else:
            setattr(param, field, value)
    return ok


def _upgrade_v0_net(net):
    _fold_padding_layers(net)
    ok = True
    upgraded = []
    for conn in net.layers:
        layer = V1()
        ok &= _upgrade_v0_layer(conn, layer)
        upgraded.append(layer)
    del net.layers[:]
    net.layers.extend(upgraded)
    return ok


# ---------------------------------------------------------------------------
# Data transformation fields -> transform_param
# ---------------------------------------------------------------------------

_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")
_V1_DATA_PARAMS = {V1.DATA: "data_param", V1.IMAGE_DATA: "image_data_param",
                   V1.WINDOW_DATA: "window_data_param"}
_DATA_PARAMS = {"Data": "data_param", "ImageData": "image_data_param",
                "WindowData": "window_data_param"}


def _data_layers(net):
    """(layer, name of its data parameter message) for V1 and current data layers."""
    for layer in net.layers:
        if layer.type in _V1_DATA_PARAMS:
            yield layer, _V1_DATA_PARAMS[layer.type]
    for layer in net.layer:
        if layer.type in _DATA_PARAMS:
            yield layer, _DATA_PARAMS[layer.type]


def _needs_data_upgrade(net):
    for layer, param_name in _data_layers(net):
        if layer.HasField(param_name):
            param = getattr(layer, param_name)
            if any(param.HasField(f) for f in _TRANSFORM_FIELDS):
                return True
    return False


def _upgrade_data_transformation(net):
    for layer, param_name in _data_layers(net):
        param = getattr(layer, param_name)
        for field in _TRANSFORM_FIELDS:
            if param.HasField(field):
                setattr(layer.transform_param, field, getattr(param, field))
                param.ClearField(field)


# ---------------------------------------------------------------------------
# V1 -> current
# ---------------------------------------------------------------------------

_V1_TYPE_NAMES = {
    V1.NONE: "", V1.ABSVAL: "AbsVal", V1.ACCURACY: "Accuracy", V1.ARGMAX: "ArgMax",
    V1.BNLL: "BNLL", V1.CONCAT: "Concat", V1.CONTRASTIVE_LOSS: "ContrastiveLoss",
    V1.CONVOLUTION: "Convolution", V1.DECONVOLUTION: "Deconvolution", V1.DATA: "Data",
    V1.DROPOUT: "Dropout", V1.DUMMY_DATA: "DummyData", V1.EUCLIDEAN_LOSS: "EuclideanLoss",
    V1.ELTWISE: "Eltwise", V1.EXP: "Exp", V1.FLATTEN: "Flatten", V1.HDF5_DATA: "HDF5Data",
    V1.HDF5_OUTPUT: "HDF5Output", V1.HINGE_LOSS: "HingeLoss", V1.IM2COL: "Im2col",
    V1.IMAGE_DATA: "ImageData", V1.INFOGAIN_LOSS: "InfogainLoss",
    V1.INNER_PRODUCT: "InnerProduct", V1.LRN: "LRN", V1.MEMORY_DATA: "MemoryData",
    V1.MULTINOMIAL_LOGISTIC_LOSS: "MultinomialLogisticLoss", V1.MVN: "MVN",
    V1.POOLING: "Pooling", V1.POWER: "Power", V1.RELU: "ReLU", V1.SIGMOID: "Sigmoid",
    V1.SIGMOID_CROSS_ENTROPY_LOSS: "SigmoidCrossEntropyLoss", V1.SILENCE: "Silence",
    V1.SOFTMAX: "Softmax", V1.SOFTMAX_LOSS: "SoftmaxWithLoss", V1.SPLIT: "Split",
    V1.SLICE: "Slice", V1.TANH: "TanH", V1.WINDOW_DATA: "WindowData",
    V1.THRESHOLD: "Threshold",
}

# Every *_param message a V1 layer can carry also exists, under the same name, on the current
# LayerParameter; read the list from the schema rather than keep a copy here.
_V1_PARAM_FIELDS = tuple(
    f.name for f in V1.DESCRIPTOR.fields
    if f.name.endswith("_param") and f.name in caffe_pb2.LayerParameter.DESCRIPTOR.fields_by_name)

_SHARE_MODES = {V1.STRICT: caffe_pb2.ParamSpec.STRICT,
                V1.PERMISSIVE: caffe_pb2.ParamSpec.PERMISSIVE}


def _param_spec(layer, i):
    while len(layer.param) <= i:
        layer.param.add()
    return layer.param[i]


def _upgrade_v1_layer(v1, layer):
    """One V1 layer -> current LayerParameter; returns False when something was dropped."""
    ok = True
    layer.bottom.extend(v1.bottom)
    layer.top.extend(v1.top)
    if v1.HasField("name"):
        layer.name = v1.name
    layer.include.extend(v1.include)
    layer.exclude.extend(v1.exclude)
    if v1.HasField("type"):
        if v1.type not in _V1_TYPE_NAMES:
            raise UpgradeError("unknown V1 layer type %d in layer %s" % (v1.type, v1.name))
        layer.type = _V1_TYPE_NAMES[v1.type]
    layer.blobs.extend(v1.blobs)
    for i, name in enumerate(v1.param):
        _param_spec(layer, i).name = name
    for i, mode in enumerate(v1.blob_share_mode):
        _param_spec(layer, i).share_mode = _SHARE_MODES[mode]
    for i, lr in enumerate(v1.blobs_lr):
        _param_spec(layer, i).lr_mult = lr
    for i, decay in enumerate(v1.weight_decay):
        _param_spec(layer, i).decay_mult = decay
    layer.loss_weight.extend(v1.loss_weight)
    for name in _V1_PARAM_FIELDS:
        if v1.HasField(name):
            getattr(layer, name).CopyFrom(getattr(v1, name))
    if v1.HasField("layer"):
        log.error("Input NetParameter has V0 layer -- ignoring.")
        ok = False
    return ok


def _upgrade_v1_net(net):
    if len(net.layer):
        raise UpgradeError(
            "refusing to upgrade a net that has both 'layer' and 'layers' fields; the current "
            "format is layer { type: 'Name' ... }, not layers { type: NAME ... }: switch the "
            "definition to 'layer' by hand")
    ok = True
    for i, v1 in enumerate(net.layers):
        if not _upgrade_v1_layer(v1, net.layer.add()):
            log.error("Upgrade of input layer %d failed.", i)
            ok = False
    net.ClearField("layers")
    return ok


# ---------------------------------------------------------------------------
# Net inputs -> Input layer; BatchNorm param specs
# ---------------------------------------------------------------------------

def _upgrade_input(net):
    has_shape = len(net.input_shape) > 0
    has_dim = len(net.input_dim) > 0
    if has_shape or has_dim:
        if has_shape and len(net.input_shape) != len(net.input):
            raise UpgradeError("%d input blobs but %d input_shape entries"
                               % (len(net.input), len(net.input_shape)))
        if not has_shape and len(net.input_dim) != 4 * len(net.input):
            raise UpgradeError("%d input blobs need %d input_dim values (4 each), got %d"
                               % (len(net.input), 4 * len(net.input), len(net.input_dim)))
        input_layer = caffe_pb2.LayerParameter(name="input", type="Input")
        for i, top in enumerate(net.input):
            input_layer.top.append(top)
            shape = input_layer.input_param.shape.add()
            if has_shape:
                shape.CopyFrom(net.input_shape[i])
            else:
                shape.dim.extend(net.input_dim[4 * i:4 * i + 4])
        # The Input layer goes first so that every later layer finds its bottoms.
        rest = caffe_pb2.NetParameter()
        rest.layer.extend(net.layer)
        net.ClearField("layer")
        net.layer.add().CopyFrom(input_layer)
        net.layer.extend(rest.layer)
    net.ClearField("input")
    net.ClearField("input_shape")
    net.ClearField("input_dim")


def _needs_batch_norm_upgrade(net):
    return any(l.type == "BatchNorm" and len(l.param) == 3 for l in net.layer)


def _upgrade_batch_norm(net):
    # The old BatchNorm definition declared its three statistics blobs as params with
    # lr_mult 0; the layer now masks them itself, so the declarations go.
    for layer in net.layer:
        if layer.type == "BatchNorm" and len(layer.param) == 3:
            layer.ClearField("param")


# ---------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------

def net_needs_upgrade(net):
    return (_needs_v0_upgrade(net) or len(net.layers) > 0 or _needs_data_upgrade(net)
            or len(net.input) > 0 or _needs_batch_norm_upgrade(net))


def upgrade_net(net, source="<net>"):
    """Bring a NetParameter of any legacy format up to date in place; True if it changed."""
    changed = False
    if _needs_v0_upgrade(net):
        log.info("Attempting to upgrade input file specified using deprecated "
                 "V0LayerParameter: %s", source)
        if _upgrade_v0_net(net):
            log.info("Successfully upgraded file specified using deprecated V0LayerParameter")
        else:
            log.error("Warning: had one or more problems upgrading V0NetParameter to "
                      "NetParameter (see above); continuing anyway.")
        log.warning("Note that future Caffe releases will not support V0NetParameter; use "
                    "poseidon-caffe upgrade-net to upgrade this and any other net protos to "
                    "the new format.")
        changed = True
    if _needs_data_upgrade(net):
        log.info("Attempting to upgrade input file specified using deprecated transformation "
                 "parameters: %s", source)
        _upgrade_data_transformation(net)
        log.info("Successfully upgraded file specified using deprecated data transformation "
                 "parameters.")
        log.warning("Note that future Caffe releases will only support transform_param "
                    "messages for transformation fields.")
        changed = True
    if len(net.layers):
        log.info("Attempting to upgrade input file specified using deprecated "
                 "V1LayerParameter: %s", source)
        if _upgrade_v1_net(net):
            log.info("Successfully upgraded file specified using deprecated V1LayerParameter")
        else:
            log.error("Warning: had one or more problems upgrading V1LayerParameter (see "
                      "above); continuing anyway.")
        changed = True
    if len(net.input):
        log.info("Attempting to upgrade input file specified using deprecated input fields: "
                 "%s", source)
        _upgrade_input(net)
        log.info("Successfully upgraded file specified using deprecated input fields.")
        log.warning("Note that future Caffe releases will only support input layers and not "
                    "input fields.")
        changed = True
    if _needs_batch_norm_upgrade(net):
        log.info("Attempting to upgrade batch norm layers using deprecated params: %s", source)
        _upgrade_batch_norm(net)
        log.info("Successfully upgraded batch norm layers using deprecated params.")
        changed = True
    return changed


_SOLVER_TYPE_NAMES = {
    caffe_pb2.SolverParameter.SGD: "SGD", caffe_pb2.SolverParameter.NESTEROV: "Nesterov",
    caffe_pb2.SolverParameter.ADAGRAD: "AdaGrad", caffe_pb2.SolverParameter.RMSPROP: "RMSProp",
    caffe_pb2.SolverParameter.ADADELTA: "AdaDelta", caffe_pb2.SolverParameter.ADAM: "Adam",
}


def upgrade_solver(solver, source="<solver>"):
    """Replace the legacy enum ``solver_type`` by the string ``type``; True if it changed."""
    if not solver.HasField("solver_type"):
        return False
    log.info("Attempting to upgrade input file specified using deprecated 'solver_type' field "
             "(enum)': %s", source)
    if solver.HasField("type"):
        raise UpgradeError("failed to upgrade solver: the old solver_type field (enum) and the "
                           "new type field (string) cannot both be given")
    solver.type = _SOLVER_TYPE_NAMES[solver.solver_type]
    solver.ClearField("solver_type")
    log.info("Successfully upgraded file specified using deprecated 'solver_type' field (enum) "
             "to 'type' field (string).")
    log.warning("Note that future Caffe releases might remove 'solver_type' field (enum) and "
                "only support 'type' field (string) in protobuf text.")
    return True
