"""What the simulator knows of a net: its layers in order, its learnable blobs (shape, the
layer whose backward makes the gradient final, the layer whose forward first needs the fresh
value, and for an InnerProduct weight the sufficient factors' shape) and its batch.

The net is built in the TRAIN phase, as ``train`` builds it, but only shaped: nothing is
allocated, so a net larger than this machine can hold is still read. Layers that read a
dataset (Data, ImageData, WindowData) become Input layers of the shape they would produce:
batch_size from their parameters, channels x height x width from ``data_shape`` or, when not
given, 3 x crop_size x crop_size (ImageNet-style nets).
"""
import contextlib
import os

from .. import memory
from ..proto import caffe_pb2
from ..sync import planner

DATASET_LAYERS = ("Data", "ImageData", "WindowData")


class SimulationError(ValueError):
    """Input the simulator cannot use; the message names the file, layer or flag."""


class FactorShape:
    """An InnerProduct weight's sufficient factors: K rows of M inputs and N outputs."""

    def __init__(self, M, N, rows_per_pass):
        self.M, self.N, self.rows_per_pass = int(M), int(N), int(rows_per_pass)


class Param:
    """One learnable blob, with the attributes the planner and the bucket maker read."""

    def __init__(self, index, name, shape, ready_layer, first_use, sfb=None):
        self.index = index
        self.name = name
        self.shape = tuple(shape)
        count = 1
        for d in self.shape:
            count *= int(d)
        self.count = count
        self.rows = self.shape[0] if self.shape else 1
        self.ready_layer = ready_layer
        self.first_use = first_use
        self.sfb = sfb
        self.bucket = None

    @property
    def nbytes(self):
        return 4 * self.count


class NetModel:
    def __init__(self, name, layer_names, layer_types, params, batch, source=""):
        self.name = name
        self.layer_names = list(layer_names)
        self.layer_types = list(layer_types)
        self.params = list(params)
        self.batch = int(batch)
        self.source = source

    @property
    def param_bytes(self):
        return sum(p.nbytes for p in self.params)


def parse_data_shape(text):
    """``3,227,227`` -> (3, 227, 227)."""
    try:
        dims = tuple(int(d) for d in str(text).replace("x", ",").split(","))
    except ValueError:
        dims = ()
    if len(dims) != 3 or min(dims) <= 0:
        raise SimulationError("-data_shape=%r is not CHANNELS,HEIGHT,WIDTH (e.g. 3,227,227)"
                              % (text,))
    return dims


def _input_for(layer, data_shape, source, batch=None):
    """The Input layer that stands for a dataset layer: same name, tops and phase rules."""
    kind = layer.type
    if not batch:
        batch = (layer.data_param.batch_size if kind == "Data" else
                 layer.image_data_param.batch_size if kind == "ImageData" else
                 layer.window_data_param.batch_size)
    if batch <= 0:
        raise SimulationError("%s: layer %s has no batch_size" % (source, layer.name))
    if data_shape is None:
        crop = layer.transform_param.crop_size
        if kind == "ImageData" and not crop and layer.image_data_param.new_height:
            data_shape = (3, layer.image_data_param.new_height, layer.image_data_param.new_width)
        elif crop:
            data_shape = (3, crop, crop)
        else:
            raise SimulationError("%s: layer %s (%s) reads a dataset and sets no crop_size; "
                                  "give its image shape with -data_shape=C,H,W"
                                  % (source, layer.name, kind))
    replacement = caffe_pb2.LayerParameter()
    replacement.name = layer.name
    replacement.type = "Input"
    replacement.top.extend(layer.top)
    replacement.include.extend(layer.include)
    replacement.exclude.extend(layer.exclude)
    shapes = [(batch,) + tuple(data_shape)] + [(batch,)] * (len(layer.top) - 1)
    for shape in shapes:
        replacement.input_param.shape.add().dim.extend(shape)
    return replacement


def net_param_for_simulation(net_param, data_shape=None, source="", batch=None):
    """A copy of ``net_param`` whose dataset layers are Input layers (see the module's text);
    ``batch``, when given, replaces the first axis of every input (the batch per worker)."""
    if net_param.layers and not net_param.layer:
        from ..upgrade import upgrade_net
        net_param = caffe_pb2.NetParameter.FromString(net_param.SerializeToString())
        upgrade_net(net_param)
    out = caffe_pb2.NetParameter()
    out.CopyFrom(net_param)
    del out.layer[:]
    for layer in net_param.layer:
        if layer.type in DATASET_LAYERS:
            out.layer.add().CopyFrom(_input_for(layer, data_shape, source, batch))
        elif layer.type == "Input" and batch:
            copy = out.layer.add()
            copy.CopyFrom(layer)
            for shape in copy.input_param.shape:
                if len(shape.dim):
                    shape.dim[0] = batch
        elif layer.type == "HDF5Data":
            raise SimulationError("%s: layer %s reads HDF5 files, whose shapes the simulator "
                                  "cannot know; put an Input layer of the same tops in its "
                                  "place" % (source, layer.name))
        else:
            out.layer.add().CopyFrom(layer)
    return out


@contextlib.contextmanager
def shapes_only():
    """Build a net for its shapes alone: the memory check does not apply (nothing is
    allocated)."""
    old = os.environ.get(memory.LIMIT_VARIABLE)
    os.environ[memory.LIMIT_VARIABLE] = "1024T"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(memory.LIMIT_VARIABLE, None)
        else:
            os.environ[memory.LIMIT_VARIABLE] = old


def build_net(net_path, data_shape=None, allocate=False, batch=None):
    """The TRAIN net of ``net_path`` (a prototxt path or a NetParameter) with its dataset
    layers as Input layers (``batch`` per worker when given); ``allocate`` False builds it
    for its shapes only."""
    from ..io import read_net_param
    from ..net import Net
    if isinstance(net_path, caffe_pb2.NetParameter):
        param, source = net_path, net_path.name or "(net)"
    else:
        param, source = read_net_param(net_path), net_path
    if batch is not None and batch < 1:
        raise SimulationError("-batch=%d: a worker's batch is at least 1" % batch)
    param = net_param_for_simulation(param, data_shape, source, batch)
    context = contextlib.nullcontext() if allocate else shapes_only()
    with context:
        net = Net(param, caffe_pb2.TRAIN)
    return net, source


def net_model(net, source=""):
    """The NetModel of a built net: its exchanged blobs as the sync engine would make them."""
    params = []
    for index, name, blob, first, offer in planner.exchanged_params(net):
        sfb = (FactorShape(offer["inputs"], offer["outputs"], offer["rows_per_pass"])
               if offer is not None else None)
        params.append(Param(index, name, blob.shape, first, first, sfb))
    if not params:
        raise SimulationError("%s: net %s has no learnable parameters, so there is nothing "
                              "to exchange between hosts and nothing to simulate"
                              % (source or "the net", net.name or "(unnamed)"))
    batch = _batch(net)
    types = [layer.param.type for layer in net.layers]
    return NetModel(net.name, net.layer_names, types, params, batch, source)


def _batch(net):
    """Images per worker and iteration: the first axis of the net's first top."""
    for i in range(len(net.layers)):
        _, tops = net.layer_blobs(i)
        for top in tops:
            if top.shape:
                return int(top.shape[0])
    return 1


def load(net_path, data_shape=None, batch=None):
    """(NetModel, built net) of a prototxt, shaped only."""
    net, source = build_net(net_path, data_shape, batch=batch)
    return net_model(net, source), net
