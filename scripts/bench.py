"""Time one training iteration (forward + backward) of five nets, ours against PyTorch.

    python scripts/bench.py [--threads 1,2] [--iters N] [--rounds R] [--nets lenet,
                            cifar10_quick,alexnet,googlenet,vgg16] [--torch PYTHON]
                            [--profile] [--check] [--readme] [--max-others 0.25]
                            [--max-load L]
    python scripts/bench.py --roofline [--nets ...] [--threads ...]   (scripts/roofline.py)

Nets (batch, input):
  lenet           64, 1x28x28      Caffe's examples/mnist LeNet
  cifar10_quick  100, 3x32x32      Caffe's examples/cifar10 quick net
  alexnet         32, 3x227x227    Caffe's bvlc_alexnet (LRN, grouped convolutions)
  googlenet       32, 3x224x224    examples/googlenet/train_val.prototxt, TRAIN phase, its data
                                   layer replaced by DummyData of the same shape; all three
                                   losses (0.3, 0.3, 1), LRN, inception branches, dropout
  vgg16           32, 3x64x64      VGG-16's layout (configuration D: thirteen 3x3 convolutions
                                   in five blocks of 64-512 channels, 2x2 max pooling), at
                                   64x64 so that an iteration takes seconds, not tens; then
                                   fc 4096, 4096 (dropout 0.5) and 1000

Each (net, threads, engine) runs in its own subprocess, with OPENBLAS_NUM_THREADS (and the
OMP / MKL equivalents) set before numpy loads; it reports the best of N iterations (wall and
process CPU time) and its peak resident memory (ru_maxrss of that process, and the same less
what the process held once its libraries were imported). Our net shares the diffs of blobs
whose gradients are never needed at once, as `poseidon-caffe train` does (PyTorch frees an
intermediate gradient once it is used). The input is drawn once and kept, on
both sides: drawing a fresh batch every iteration would time the random generator, not the net.
googlenet and vgg16 run in PyTorch as a translation of the same prototxt (the same layers,
shapes, fillers, in-place ReLU and dropout, loss weights); lenet, cifar10_quick and alexnet as
the hand-written equivalents below. --check runs both on the same weights without dropout and
compares the losses. --profile adds a per-layer-type breakdown and the time inside GEMM and FFT.

Figures move by tens of percent on a busy machine, so --readme prints the table in README's
form only when every row ran quiet: a row is busy when the processes this run did not start
used more than --max-others cores on average while it ran (their CPU time in /proc; 0.25 by
default). The 1-minute load average is recorded too (the highest read around the row's runs),
but it counts the bench's own processes and remembers the previous row for a minute, so it
cannot tell a busy machine from the bench itself; --max-load L also marks a row whose load,
less its own threads past the first, is above L. A busy row is marked in the table, the table
is headed NOT FOR README, and the exit status is 3.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOOGLENET = os.path.join(ROOT, "examples", "googlenet", "train_val.prototxt")

BATCH = {"lenet": 64, "cifar10_quick": 100, "alexnet": 32, "googlenet": 32, "vgg16": 32}
INPUT = {"lenet": (1, 28, 28), "cifar10_quick": (3, 32, 32), "alexnet": (3, 227, 227),
         "googlenet": (3, 224, 224), "vgg16": (3, 64, 64)}
NETS = tuple(BATCH)
# best-of iterations when --iters is not given: the big nets take seconds an iteration
ITERS = {"lenet": 10, "cifar10_quick": 10, "alexnet": 5, "googlenet": 3, "vgg16": 3}
# one training iteration, ms, one thread, measured on this machine: Caffe 1.0 / PyTorch
REFERENCE_1T = {"lenet": (20, 17), "cifar10_quick": (162, 82), "alexnet": (1908, 1556)}
# README's name for each net and batch
README_NAME = {"lenet": "LeNet, 64", "cifar10_quick": "CIFAR-10 quick, 100",
               "alexnet": "AlexNet, 32", "googlenet": "GoogLeNet, 32",
               "vgg16": "VGG-16 at 64x64, 32"}
# the most cores other processes may use on average while a README row runs
QUIET_OTHERS = 0.25
VGG16_BLOCKS = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))


def _weights(std):
    """A gaussian weight filler, or Caffe's xavier when ``std`` is None."""
    return ('weight_filler { type: "gaussian" std: %g }' % std if std is not None else
            'weight_filler { type: "xavier" }')


def _conv(name, bottom, n, k, stride=1, pad=0, group=1, std=0.01):
    return ('layer { name: "%s" type: "Convolution" bottom: "%s" top: "%s" convolution_param {'
            ' num_output: %d kernel_size: %d stride: %d pad: %d group: %d'
            ' %s bias_filler { type: "constant" } } }\n'
            % (name, bottom, name, n, k, stride, pad, group, _weights(std)))


def _pool(name, bottom, method, k, s):
    return ('layer { name: "%s" type: "Pooling" bottom: "%s" top: "%s" pooling_param {'
            ' pool: %s kernel_size: %d stride: %d } }\n' % (name, bottom, name, method, k, s))


def _relu(name, blob):
    return 'layer { name: "%s" type: "ReLU" bottom: "%s" top: "%s" }\n' % (name, blob, blob)


def _ip(name, bottom, n, std=0.01):
    return ('layer { name: "%s" type: "InnerProduct" bottom: "%s" top: "%s" inner_product_param {'
            ' num_output: %d %s bias_filler { type: "constant" } } }\n'
            % (name, bottom, name, n, _weights(std)))


def _lrn(name, bottom):
    return ('layer { name: "%s" type: "LRN" bottom: "%s" top: "%s" lrn_param {'
            ' local_size: 5 alpha: 0.0001 beta: 0.75 } }\n' % (name, bottom, name))


def _dropout(name, blob):
    return ('layer { name: "%s" type: "Dropout" bottom: "%s" top: "%s" dropout_param {'
            ' dropout_ratio: 0.5 } }\n' % (name, blob, blob))


def _dummy_data(shape, batch):
    # constant fillers fill once at setup; the worker writes its drawn input over them
    return ('layer { name: "data" type: "DummyData" top: "data" top: "label"'
            ' dummy_data_param { data_filler { type: "constant" value: 0 }'
            ' data_filler { type: "constant" value: 1 }'
            ' shape { dim: %d dim: %d dim: %d dim: %d } shape { dim: %d } } }\n'
            % ((batch,) + tuple(shape) + (batch,)))


def _googlenet_prototxt():
    """examples/googlenet's train_val, TRAIN phase, its Data layer replaced by DummyData of
    the batch and crop it reads."""
    from google.protobuf import text_format
    from poseidon_caffe.net.filtering import filter_net
    from poseidon_caffe.proto import caffe_pb2
    with open(GOOGLENET) as f:
        param = text_format.Parse(f.read(), caffe_pb2.NetParameter())
    state = caffe_pb2.NetState(phase=caffe_pb2.TRAIN)
    param = filter_net(param, state)
    text = "name: %s\n" % json.dumps(param.name)
    for layer in param.layer:
        if layer.type == "Data":
            crop = layer.transform_param.crop_size
            batch = layer.data_param.batch_size
            if (batch, 3, crop, crop) != (BATCH["googlenet"],) + INPUT["googlenet"]:
                raise SystemExit("%s: the TRAIN data layer reads batch %d crop %d, the bench "
                                 "expects %s" % (GOOGLENET, batch, crop, INPUT["googlenet"]))
            text += _dummy_data(INPUT["googlenet"], batch)
        else:
            text += "layer {\n%s}\n" % text_format.MessageToString(layer, indent=2)
    return text


def _vgg16_prototxt():
    text = ""
    bottom = "data"
    for b, widths in enumerate(VGG16_BLOCKS, 1):
        for i, width in enumerate(widths, 1):
            name = "conv%d_%d" % (b, i)
            text += _conv(name, bottom, width, 3, pad=1, std=None)
            text += _relu("relu%d_%d" % (b, i), name)
            bottom = name
        text += _pool("pool%d" % b, bottom, "MAX", 2, 2)
        bottom = "pool%d" % b
    # xavier throughout: sixteen layers of gaussian 0.01 would shrink the signal to nothing
    text += _ip("fc6", bottom, 4096, None) + _relu("relu6", "fc6") + _dropout("drop6", "fc6")
    text += _ip("fc7", "fc6", 4096, None) + _relu("relu7", "fc7") + _dropout("drop7", "fc7")
    text += _ip("fc8", "fc7", 1000, None)
    return text, "fc8"


def net_prototxt(net):
    if net == "googlenet":
        return _googlenet_prototxt()
    text = 'name: "%s"\n' % net + _dummy_data(INPUT[net], BATCH[net])
    if net == "lenet":
        text += _conv("conv1", "data", 20, 5, std=0.1) + _pool("pool1", "conv1", "MAX", 2, 2)
        text += _conv("conv2", "pool1", 50, 5, std=0.1) + _pool("pool2", "conv2", "MAX", 2, 2)
        text += _ip("ip1", "pool2", 500) + _relu("relu1", "ip1") + _ip("ip2", "ip1", 10)
        last = "ip2"
    elif net == "cifar10_quick":
        text += _conv("conv1", "data", 32, 5, pad=2, std=0.0001)
        text += _pool("pool1", "conv1", "MAX", 3, 2) + _relu("relu1", "pool1")
        text += _conv("conv2", "pool1", 32, 5, pad=2) + _relu("relu2", "conv2")
        text += _pool("pool2", "conv2", "AVE", 3, 2)
        text += _conv("conv3", "pool2", 64, 5, pad=2) + _relu("relu3", "conv3")
        text += _pool("pool3", "conv3", "AVE", 3, 2)
        text += _ip("ip1", "pool3", 64, 0.1) + _ip("ip2", "ip1", 10, 0.1)
        last = "ip2"
    elif net == "vgg16":
        body, last = _vgg16_prototxt()
        text += body
    else:
        text += _conv("conv1", "data", 96, 11, stride=4) + _relu("relu1", "conv1")
        text += _lrn("norm1", "conv1") + _pool("pool1", "norm1", "MAX", 3, 2)
        text += _conv("conv2", "pool1", 256, 5, pad=2, group=2) + _relu("relu2", "conv2")
        text += _lrn("norm2", "conv2") + _pool("pool2", "norm2", "MAX", 3, 2)
        text += _conv("conv3", "pool2", 384, 3, pad=1) + _relu("relu3", "conv3")
        text += _conv("conv4", "conv3", 384, 3, pad=1, group=2) + _relu("relu4", "conv4")
        text += _conv("conv5", "conv4", 256, 3, pad=1, group=2) + _relu("relu5", "conv5")
        text += _pool("pool5", "conv5", "MAX", 3, 2)
        text += _ip("fc6", "pool5", 4096, 0.005) + _relu("relu6", "fc6") + _dropout("drop6", "fc6")
        text += _ip("fc7", "fc6", 4096, 0.005) + _relu("relu7", "fc7") + _dropout("drop7", "fc7")
        text += _ip("fc8", "fc7", 1000)
        last = "fc8"
    text += ('layer { name: "loss" type: "SoftmaxWithLoss" bottom: "%s" bottom: "label"'
             ' top: "loss" }\n' % last)
    return text


# -- the same net for PyTorch: a plain description of the prototxt's layers ---------------
def torch_layers(net):
    """The TRAIN net's layers as JSON-able dicts the PyTorch worker builds its model from
    (made here, so the PyTorch process loads neither protobuf nor this project)."""
    from google.protobuf import text_format
    from poseidon_caffe.proto import caffe_pb2
    param = text_format.Parse(net_prototxt(net), caffe_pb2.NetParameter())

    def filler(f):
        return {"type": f.type, "std": f.std, "value": f.value}

    layers = []
    for layer in param.layer:
        d = {"type": layer.type, "name": layer.name, "bottom": list(layer.bottom),
             "top": list(layer.top)}
        if layer.type == "Convolution":
            p = layer.convolution_param
            d.update(num_output=p.num_output, kernel=p.kernel_size[0],
                     stride=p.stride[0] if p.stride else 1, pad=p.pad[0] if p.pad else 0,
                     group=p.group, weight_filler=filler(p.weight_filler),
                     bias_filler=filler(p.bias_filler))
        elif layer.type == "InnerProduct":
            p = layer.inner_product_param
            d.update(num_output=p.num_output, weight_filler=filler(p.weight_filler),
                     bias_filler=filler(p.bias_filler))
        elif layer.type == "Pooling":
            p = layer.pooling_param
            d.update(method=caffe_pb2.PoolingParameter.PoolMethod.Name(p.pool),
                     kernel=p.kernel_size, stride=p.stride, pad=p.pad)
        elif layer.type == "LRN":
            p = layer.lrn_param
            d.update(size=p.local_size, alpha=p.alpha, beta=p.beta, k=p.k)
        elif layer.type == "Dropout":
            d.update(ratio=layer.dropout_param.dropout_ratio)
        elif layer.type == "SoftmaxWithLoss":
            d.update(loss_weight=layer.loss_weight[0] if layer.loss_weight else 1.0)
        elif layer.type == "Concat":
            d.update(axis=layer.concat_param.axis)
        elif layer.type not in ("DummyData", "ReLU"):
            raise SystemExit("no PyTorch translation for layer %s of type %s"
                             % (layer.name, layer.type))
        layers.append(d)
    return layers


def _torch_graph(layers, batch, shape):
    """A torch.nn.Module running ``layers`` in order over named blobs, as Caffe's net does."""
    import math
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    def fill(tensor, f, fan_in):
        with torch.no_grad():
            if f["type"] == "gaussian":
                tensor.normal_(0.0, f["std"])
            elif f["type"] == "xavier":          # Caffe's default: uniform, fan in
                bound = math.sqrt(3.0 / fan_in)
                tensor.uniform_(-bound, bound)
            else:
                tensor.fill_(f["value"])

    class Graph(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = layers
            self.ops = nn.ModuleDict()
            channels = {"data": shape[0]}
            sizes = {"data": shape[1] * shape[2]}
            spatial = {"data": shape[1:]}
            for d in layers:
                key = d["name"].replace("/", "__").replace(".", "_")
                d["key"] = key
                kind = d["type"]
                b = d["bottom"][0] if d["bottom"] else None
                if kind == "Convolution":
                    op = nn.Conv2d(channels[b], d["num_output"], d["kernel"], d["stride"],
                                   d["pad"], groups=d["group"])
                    fill(op.weight, d["weight_filler"], op.weight[0].numel())
                    fill(op.bias, d["bias_filler"], 1)
                    h, w = spatial[b]
                    out = [(v + 2 * d["pad"] - d["kernel"]) // d["stride"] + 1 for v in (h, w)]
                    channels[d["top"][0]] = d["num_output"]
                    spatial[d["top"][0]] = tuple(out)
                elif kind == "InnerProduct":
                    fan_in = channels[b] * spatial[b][0] * spatial[b][1]
                    op = nn.Linear(fan_in, d["num_output"])
                    fill(op.weight, d["weight_filler"], fan_in)
                    fill(op.bias, d["bias_filler"], 1)
                    channels[d["top"][0]] = d["num_output"]
                    spatial[d["top"][0]] = (1, 1)
                elif kind == "Pooling":
                    # Caffe rounds up, minus a last window that starts in the padding:
                    # PyTorch's ceil_mode rule; AVE divides by the window clipped to the
                    # padded input, as count_include_pad does
                    cls = nn.MaxPool2d if d["method"] == "MAX" else nn.AvgPool2d
                    op = cls(d["kernel"], d["stride"], d["pad"], ceil_mode=True)
                    h, w = spatial[b]
                    out = []
                    for v in (h, w):
                        o = -(-(v + 2 * d["pad"] - d["kernel"]) // d["stride"]) + 1
                        if d["pad"] and (o - 1) * d["stride"] >= v + d["pad"]:
                            o -= 1
                        out.append(o)
                    channels[d["top"][0]] = channels[b]
                    spatial[d["top"][0]] = tuple(out)
                elif kind == "LRN":
                    op = nn.LocalResponseNorm(d["size"], d["alpha"], d["beta"], d["k"])
                elif kind == "ReLU":
                    op = nn.ReLU(inplace=d["top"] == d["bottom"])
                elif kind == "Dropout":
                    # not in place: PyTorch's ReLU backward reads the output dropout would
                    # overwrite (Caffe's reads its own copy of the mask instead)
                    op = nn.Dropout(d["ratio"])
                elif kind == "Concat":
                    op = None
                    channels[d["top"][0]] = sum(channels[x] for x in d["bottom"])
                    spatial[d["top"][0]] = spatial[d["bottom"][0]]
                else:
                    op = None
                if op is not None:
                    self.ops[key] = op
                for t in d["top"]:
                    channels.setdefault(t, channels.get(b))
                    spatial.setdefault(t, spatial.get(b))

        def forward(self, data, label):
            blobs = {"data": data, "label": label}
            loss = 0.0
            for d in self.layers:
                kind = d["type"]
                if kind == "DummyData":
                    continue
                if kind == "SoftmaxWithLoss":
                    loss = loss + d["loss_weight"] * F.cross_entropy(
                        blobs[d["bottom"][0]], blobs[d["bottom"][1]])
                    continue
                if kind == "Concat":
                    y = torch.cat([blobs[b] for b in d["bottom"]], d["axis"])
                else:
                    x = blobs[d["bottom"][0]]
                    if kind == "InnerProduct":
                        x = x.flatten(1)
                    y = self.ops[d["key"]](x)
                blobs[d["top"][0]] = y
            return loss

    return Graph()


# -- the worker: one net, one thread count, in a fresh process ---------------------------------
def _input(net_name, seed=1):
    import numpy as np
    return np.random.default_rng(seed).standard_normal(
        (BATCH[net_name],) + INPUT[net_name], dtype=np.float32)


def _ours(net_name):
    from google.protobuf import text_format
    from poseidon_caffe.net import Net
    from poseidon_caffe.proto import caffe_pb2
    param = text_format.Parse(net_prototxt(net_name), caffe_pb2.NetParameter())
    net = Net(param, caffe_pb2.TRAIN)
    net.blobs["data"].data[...] = _input(net_name)
    return net


def _time_ours(net_name, iters, profile):
    net = _ours(net_name)
    net.share_diffs()             # as `poseidon-caffe train` and `time` run a net
    net.forward_backward()                       # warm-up: buffers, plans
    def step():
        net.clear_param_diffs()
        net.forward_backward()
    result = _measure(step, iters)
    if profile:
        result["profile"] = _profile(net, iters)
    return result


def _rss_mib():
    """Resident memory of this process now, MiB (VmRSS, in KiB)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def _peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _measure(step, iters):
    """Best wall-clock and best process-CPU ms of ``iters`` calls (CPU time is the steadier
    number on a shared machine with one thread; wall time is the one that counts threads)."""
    wall, cpu = [], []
    for _ in range(iters):
        w0, c0 = time.perf_counter(), time.process_time()
        step()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return {"ms": 1000 * min(wall), "mean_ms": 1000 * sum(wall) / len(wall),
            "cpu_ms": 1000 * min(cpu)}


def _profile(net, iters):
    """Per layer type forward/backward ms, and the time inside GEMMs (real and the complex ones
    of FFT convolution) and inside FFTs, found by timing those calls in place."""
    import numpy as np
    import scipy.fft as sfft
    from poseidon_caffe.backend.cpu import backend as cpu
    spent = {"gemm": 0.0, "fft": 0.0}
    depth = [0]

    def timed(kind, fn):
        def wrapper(*args, **kwargs):
            if depth[0]:
                return fn(*args, **kwargs)
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[kind] += time.perf_counter() - t0
                depth[0] -= 1
        return wrapper

    originals = [(np, "matmul"), (np, "dot"), (cpu.CPUBackend, "gemm"), (sfft, "rfftn"),
                 (sfft, "irfftn")]
    saved = [(owner, name, getattr(owner, name)) for owner, name in originals]
    for owner, name, fn in saved:
        setattr(owner, name, timed("fft" if "fft" in name else "gemm", fn))
    per_type = {}
    total = 0.0
    try:
        for _ in range(iters):
            for i, layer in enumerate(net.layers):
                t0 = time.perf_counter()
                net.forward_from_to(i, i)
                dt = time.perf_counter() - t0
                per_type.setdefault(layer.type, [0.0, 0.0])[0] += dt
                total += dt
            for i in reversed(range(len(net.layers))):
                t0 = time.perf_counter()
                net.backward_from_to(i, i)
                dt = time.perf_counter() - t0
                per_type.setdefault(net.layers[i].type, [0.0, 0.0])[1] += dt
                total += dt
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)
    scale = 1000.0 / iters
    return {"total_ms": total * scale, "gemm_ms": spent["gemm"] * scale,
            "fft_ms": spent["fft"] * scale,
            "per_type_ms": {k: [v[0] * scale, v[1] * scale] for k, v in per_type.items()}}


def _torch_model(net_name, layers):
    import torch.nn as nn
    if layers is not None:
        return _torch_graph(layers, BATCH[net_name], INPUT[net_name])
    if net_name == "lenet":
        body = nn.Sequential(nn.Conv2d(1, 20, 5), nn.MaxPool2d(2, 2), nn.Conv2d(20, 50, 5),
                             nn.MaxPool2d(2, 2), nn.Flatten(), nn.Linear(800, 500), nn.ReLU(),
                             nn.Linear(500, 10))
    elif net_name == "cifar10_quick":
        body = nn.Sequential(nn.Conv2d(3, 32, 5, padding=2), nn.MaxPool2d(3, 2, ceil_mode=True),
                             nn.ReLU(), nn.Conv2d(32, 32, 5, padding=2), nn.ReLU(),
                             nn.AvgPool2d(3, 2, ceil_mode=True), nn.Conv2d(32, 64, 5, padding=2),
                             nn.ReLU(), nn.AvgPool2d(3, 2, ceil_mode=True), nn.Flatten(),
                             nn.Linear(64 * 4 * 4, 64), nn.Linear(64, 10))
    else:
        body = nn.Sequential(
            nn.Conv2d(3, 96, 11, stride=4), nn.ReLU(), nn.LocalResponseNorm(5, 1e-4, 0.75),
            nn.MaxPool2d(3, 2, ceil_mode=True), nn.Conv2d(96, 256, 5, padding=2, groups=2),
            nn.ReLU(), nn.LocalResponseNorm(5, 1e-4, 0.75), nn.MaxPool2d(3, 2, ceil_mode=True),
            nn.Conv2d(256, 384, 3, padding=1), nn.ReLU(),
            nn.Conv2d(384, 384, 3, padding=1, groups=2), nn.ReLU(),
            nn.Conv2d(384, 256, 3, padding=1, groups=2), nn.ReLU(),
            nn.MaxPool2d(3, 2, ceil_mode=True), nn.Flatten(), nn.Linear(9216, 4096), nn.ReLU(),
            nn.Dropout(), nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout(), nn.Linear(4096, 1000))
    loss_fn = nn.CrossEntropyLoss()

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = body

        def forward(self, data, label):
            return loss_fn(self.body(data), label)
    return Model()


def _time_torch(net_name, iters, layers):
    import torch
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model = _torch_model(net_name, layers)
    x = torch.from_numpy(_input(net_name))
    y = torch.ones(BATCH[net_name], dtype=torch.long)

    def step():
        model.zero_grad()
        model(x, y).backward()
    step()
    return _measure(step, iters)


def _check(net_name, layers):
    """The loss of ours and of the PyTorch translation on the same weights and input, with
    dropout off (ratio 0 on both sides): equal up to float summation order when both compute
    the same net."""
    import torch
    from poseidon_caffe.net import Net
    from poseidon_caffe.proto import caffe_pb2
    from google.protobuf import text_format
    param = text_format.Parse(net_prototxt(net_name), caffe_pb2.NetParameter())
    for layer in param.layer:
        if layer.type == "Dropout":
            layer.dropout_param.dropout_ratio = 0.0
    for d in layers:
        if d["type"] == "Dropout":
            d["ratio"] = 0.0
    net = Net(param, caffe_pb2.TRAIN)
    x = _input(net_name)
    net.blobs["data"].data[...] = x
    ours = float(net.forward_prefilled())
    model = _torch_graph(layers, BATCH[net_name], INPUT[net_name])
    with torch.no_grad():
        for d in layers:
            if d["type"] in ("Convolution", "InnerProduct"):
                op = model.ops[d["key"]]
                params = net.params[d["name"]]
                op.weight.copy_(torch.from_numpy(params[0].data.reshape(op.weight.shape)))
                op.bias.copy_(torch.from_numpy(params[1].data))
        theirs = float(model(torch.from_numpy(x), torch.ones(BATCH[net_name], dtype=torch.long)))
    return {"ours_loss": ours, "torch_loss": theirs}


def _worker(args):
    base = _rss_mib()
    if args.engine == "check":
        result = _check(args.worker, json.loads(sys.stdin.read()))
    elif args.engine == "torch":
        import torch  # noqa: F401  (its libraries count as loaded, as numpy's do for ours)
        layers = json.loads(sys.stdin.read()) if args.worker in ("googlenet", "vgg16") else None
        base = _rss_mib()
        result = _time_torch(args.worker, args.iters, layers)
    else:
        import numpy  # noqa: F401
        import scipy.fft  # noqa: F401
        import poseidon_caffe.net  # noqa: F401
        base = _rss_mib()
        result = _time_ours(args.worker, args.iters, args.profile)
    result["peak_mib"] = _peak_rss_mib()
    result["base_mib"] = base
    print("RESULT " + json.dumps(result))


# -- the driver --------------------------------------------------------------------------------
def _thread_env(threads):
    env = dict(os.environ)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    # machine-specific OpenBLAS overrides would distort the comparison
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(python, net, threads, iters, engine, profile, stdin=""):
    cmd = [python, os.path.abspath(__file__), "--worker", net, "--iters", str(iters),
           "--engine", engine] + (["--profile"] if profile else [])
    proc = subprocess.run(cmd, env=_thread_env(threads), capture_output=True, text=True,
                          input=stdin)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = "\n".join(proc.stderr.splitlines()[-15:])
    sys.stderr.write("%s %s (%d threads) failed:\n%s\n" % (engine, net, threads, tail))
    return None


def _best(a, b):
    """The faster of two results of one engine, with the larger of their peaks (the peak does
    not depend on the load)."""
    if a is None or b is None:
        return a or b
    best = dict(min((a, b), key=lambda r: r["cpu_ms"] + r["ms"]))
    for key in ("ms", "cpu_ms", "mean_ms"):
        best[key] = min(a[key], b[key])
    best["peak_mib"] = max(a["peak_mib"], b["peak_mib"])
    best["base_mib"] = max(a["base_mib"], b["base_mib"])
    return best


def _torch_python(requested):
    candidates = [requested] if requested else [sys.executable, "/tmp/torchvenv/bin/python"]
    for python in candidates:
        if python and os.path.exists(python) and subprocess.run(
                [python, "-c", "import torch"], capture_output=True).returncode == 0:
            return python
    return None


def other_cpu_seconds():
    """{pid: CPU seconds} of the processes this one did not start (itself and its descendants
    left out), as /proc shows them; {} where there is none."""
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    parents, seconds = {}, {}
    for pid in pids:
        try:
            with open("/proc/%d/stat" % pid) as f:
                text = f.read()
        except OSError:
            continue                     # gone meanwhile
        fields = text[text.rindex(")") + 2:].split()
        parents[pid] = int(fields[1])
        seconds[pid] = (int(fields[11]) + int(fields[12])) / tick     # utime + stime
    me = os.getpid()

    def ours(pid):
        while pid > 1:
            if pid == me:
                return True
            pid = parents.get(pid, 0)
        return False
    return {pid: s for pid, s in seconds.items() if not ours(pid)}


def others_load(before, after, wall):
    """The cores other processes used on average between two other_cpu_seconds() readings
    ``wall`` seconds apart (a process that ended meanwhile is not counted)."""
    used = sum(s - before.get(pid, 0.0) for pid, s in after.items())
    return max(0.0, used) / max(wall, 1e-9)


def readme_table(rows, max_others=QUIET_OTHERS, max_load=None):
    """(lines of README's table, whether every row is quiet) from the rows the driver
    measured: dicts with net, threads, ours, theirs (results or None), load and others."""
    lines = ["| net, batch | threads | ours ms | PyTorch ms | ratio | "
             "peak RSS MiB, ours / PyTorch | load, others |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    quiet = True
    for row in rows:
        key = "cpu_ms" if row["threads"] == 1 else "ms"
        ours, theirs = row["ours"], row["theirs"]

        def ms(r):
            return "-" if r is None else ("%.0f" % r[key] if r[key] >= 1000 else
                                          "%.3g" % r[key])
        ratio = "%.2f" % (ours[key] / theirs[key]) if ours and theirs else "-"
        rss = "%s / %s" % tuple("-" if r is None else "%.0f" % r["peak_mib"]
                                for r in (ours, theirs))
        load = "%.2f, %.2f" % (row["load"], row["others"])
        # the row's own threads past the first raise the load by as many (on a long row)
        if row["others"] > max_others or (
                max_load is not None and row["load"] - (row["threads"] - 1) > max_load):
            quiet = False
            load += " (busy)"
        lines.append("| %s | %d | %s | %s | %s | %s | %s |" % (
            README_NAME[row["net"]], row["threads"], ms(ours), ms(theirs), ratio, rss, load))
    return lines, quiet


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--iters", type=int, default=None,
                        help="best of N iterations (default: %s)" %
                        ", ".join("%s %d" % kv for kv in ITERS.items()))
    parser.add_argument("--nets", default=",".join(NETS))
    parser.add_argument("--rounds", type=int, default=1,
                        help="run ours and PyTorch alternately this many times each and keep "
                             "the best of each (a shared machine's load comes and goes)")
    parser.add_argument("--torch", default=None, help="a python that can import torch")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--check", action="store_true",
                        help="compare the losses of googlenet and vgg16 with PyTorch's")
    parser.add_argument("--readme", action="store_true",
                        help="end with the table in README's form (refused, exit status 3, "
                             "when a row ran busy)")
    parser.add_argument("--max-others", type=float, default=QUIET_OTHERS,
                        help="the most cores other processes may use on average during a "
                             "README row (default %(default)s)")
    parser.add_argument("--max-load", type=float, default=None,
                        help="also the highest 1-minute load average of a README row, less "
                             "its own threads past the first")
    parser.add_argument("--roofline", action="store_true",
                        help="each layer against this machine's sgemm rate and memory "
                             "bandwidth instead (scripts/roofline.py; --nets, --threads, "
                             "--iters)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--engine", default="ours", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args)
    nets = args.nets.split(",")
    unknown = [n for n in nets if n not in NETS]
    if unknown:
        parser.error("--nets takes %s, not %s" % (", ".join(NETS), ", ".join(unknown)))
    if args.roofline:
        import roofline
        return roofline.main(["--nets", args.nets, "--threads", args.threads] +
                             (["--iters", str(args.iters)] if args.iters else []) +
                             (["--torch", args.torch] if args.torch else []))
    torch_python = _torch_python(args.torch)
    if args.check:
        for net in nets:
            if net in ("googlenet", "vgg16") and torch_python:
                result = _run(torch_python, net, 1, 1, "check", False,
                              json.dumps(torch_layers(net)))
                print("%-14s loss ours %s, PyTorch %s" % (
                    net, *(("%.6f" % result[k]) if result else "failed"
                           for k in ("ours_loss", "torch_loss"))))
        return
    print("ms per training iteration, best of N (1 thread: ratio of process CPU times; more: "
          "of wall times); peak RSS in MiB (in brackets: above the libraries' own)")
    print("load: the highest 1-minute load average seen during the row, on %d cores; others: "
          "the cores other processes used meanwhile" % (os.cpu_count() or 1))
    print("%-13s %2s %3s %16s %16s %6s %13s %13s %5s %6s %9s" % (
        "net", "t", "N", "ours wall/cpu", "torch wall/cpu", "ratio", "ours RSS", "torch RSS",
        "load", "others", "ref c/t"))
    rows = []
    for net in nets:
        iters = args.iters or ITERS[net]
        layers = json.dumps(torch_layers(net)) if net in ("googlenet", "vgg16") else ""
        for threads in (int(t) for t in args.threads.split(",")):
            ours = theirs = None
            loads = [os.getloadavg()[0]]
            others_before, started = other_cpu_seconds(), time.perf_counter()
            for _ in range(args.rounds):
                ours = _best(ours, _run(sys.executable, net, threads, iters, "ours",
                                        args.profile))
                loads.append(os.getloadavg()[0])
                if torch_python:
                    theirs = _best(theirs, _run(torch_python, net, threads, iters, "torch",
                                                False, layers))
                    loads.append(os.getloadavg()[0])
            load = max(loads)
            others = others_load(others_before, other_cpu_seconds(),
                                 time.perf_counter() - started)
            rows.append({"net": net, "threads": threads, "ours": ours, "theirs": theirs,
                         "load": load, "others": others})
            ref = REFERENCE_1T.get(net, ("-", "-")) if threads == 1 else ("-", "-")
            key = "cpu_ms" if threads == 1 else "ms"    # one thread: CPU time, steadier
            ratio = "%.2f" % (ours[key] / theirs[key]) if ours and theirs else "-"

            def times(r):
                return "%.1f / %.1f" % (r["ms"], r["cpu_ms"]) if r else "-"

            def rss(r):
                return "%.0f (%.0f)" % (r["peak_mib"], r["peak_mib"] - r["base_mib"]) if r else "-"
            print("%-13s %2d %3d %16s %16s %6s %13s %13s %5.2f %6.2f %9s" % (
                net, threads, iters, times(ours), times(theirs), ratio, rss(ours), rss(theirs),
                load, others, "%s/%s" % ref))
            if args.profile and ours:
                prof = ours["profile"]
                share = 100.0 / max(prof["total_ms"], 1e-9)
                print("    profile (wall): total %.1f ms, GEMM %.1f ms (%.0f%%), FFT %.1f ms "
                      "(%.0f%%)" % (prof["total_ms"], prof["gemm_ms"], prof["gemm_ms"] * share,
                                    prof["fft_ms"], prof["fft_ms"] * share))
                for kind, (fwd, bwd) in sorted(prof["per_type_ms"].items(),
                                               key=lambda kv: -sum(kv[1])):
                    print("      %-18s fwd %8.1f  bwd %8.1f" % (kind, fwd, bwd))
            sys.stdout.flush()
    if args.readme:
        lines, quiet = readme_table(rows, args.max_others, args.max_load)
        print()
        if not quiet:
            print("NOT FOR README: rows marked (busy) ran while other processes used more "
                  "than %.2f cores%s; rerun on a quiet machine" % (
                      args.max_others, "" if args.max_load is None else
                      " or at a 1-minute load above %.2f" % args.max_load))
        print("\n".join(lines))
        if not quiet:
            return 3


if __name__ == "__main__":
    sys.exit(main())
