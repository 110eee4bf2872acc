"""Time one training iteration (forward + backward) of LeNet, CIFAR-10 quick and AlexNet.

    python scripts/bench.py [--threads 1,2] [--iters N] [--nets lenet,cifar10_quick,alexnet]
                            [--torch PYTHON] [--profile]

Each (net, threads) pair runs in its own subprocess, with OPENBLAS_NUM_THREADS (and the OMP /
MKL equivalents) set before numpy loads. When PyTorch is importable by this interpreter, or by
the interpreter given with --torch, the same nets run in PyTorch in the same way and the ratio
is printed. --profile adds a per-layer-type breakdown and the share of time spent in GEMM.
"""
import argparse
import json
import os
import subprocess
import sys
import time

BATCH = {"lenet": 64, "cifar10_quick": 100, "alexnet": 32}
INPUT = {"lenet": (1, 28, 28), "cifar10_quick": (3, 32, 32), "alexnet": (3, 227, 227)}
CLASSES = {"lenet": 10, "cifar10_quick": 10, "alexnet": 1000}
# one training iteration, ms, one thread, measured on this machine
REFERENCE_1T = {"lenet": (20, 17), "cifar10_quick": (162, 82), "alexnet": (1908, 1556)}


def _conv(name, bottom, n, k, stride=1, pad=0, group=1, std=0.01):
    return ('layer { name: "%s" type: "Convolution" bottom: "%s" top: "%s" convolution_param {'
            ' num_output: %d kernel_size: %d stride: %d pad: %d group: %d'
            ' weight_filler { type: "gaussian" std: %g } bias_filler { type: "constant" } } }\n'
            % (name, bottom, name, n, k, stride, pad, group, std))


def _pool(name, bottom, method, k, s):
    return ('layer { name: "%s" type: "Pooling" bottom: "%s" top: "%s" pooling_param {'
            ' pool: %s kernel_size: %d stride: %d } }\n' % (name, bottom, name, method, k, s))


def _relu(name, blob):
    return 'layer { name: "%s" type: "ReLU" bottom: "%s" top: "%s" }\n' % (name, blob, blob)


def _ip(name, bottom, n, std=0.01):
    return ('layer { name: "%s" type: "InnerProduct" bottom: "%s" top: "%s" inner_product_param {'
            ' num_output: %d weight_filler { type: "gaussian" std: %g }'
            ' bias_filler { type: "constant" } } }\n' % (name, bottom, name, n, std))


def _lrn(name, bottom):
    return ('layer { name: "%s" type: "LRN" bottom: "%s" top: "%s" lrn_param {'
            ' local_size: 5 alpha: 0.0001 beta: 0.75 } }\n' % (name, bottom, name))


def _dropout(name, blob):
    return ('layer { name: "%s" type: "Dropout" bottom: "%s" top: "%s" dropout_param {'
            ' dropout_ratio: 0.5 } }\n' % (name, blob, blob))


def net_prototxt(net):
    c, h, w = INPUT[net]
    b = BATCH[net]
    text = ('name: "%s"\nlayer { name: "data" type: "DummyData" top: "data" top: "label"'
            ' dummy_data_param { data_filler { type: "gaussian" std: 1 }'
            ' data_filler { type: "constant" value: 1 }'
            ' shape { dim: %d dim: %d dim: %d dim: %d } shape { dim: %d } } }\n'
            % (net, b, c, h, w, b))
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


# -- the worker: one net, one thread count, in a fresh process ---------------------------------
def _time_ours(net_name, iters, profile):
    from google.protobuf import text_format
    from poseidon_caffe.net import Net
    from poseidon_caffe.proto import caffe_pb2
    param = text_format.Parse(net_prototxt(net_name), caffe_pb2.NetParameter())
    net = Net(param, caffe_pb2.TRAIN)
    net.forward_backward()                       # warm-up: buffers, plans
    def step():
        net.clear_param_diffs()
        net.forward_backward()
    result = _measure(step, iters)
    if profile:
        result["profile"] = _profile(net, iters)
    return result


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
    from poseidon_caffe.backend import cpu
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


def _time_torch(net_name, iters):
    import torch
    import torch.nn as nn
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if net_name == "lenet":
        model = nn.Sequential(nn.Conv2d(1, 20, 5), nn.MaxPool2d(2, 2), nn.Conv2d(20, 50, 5),
                              nn.MaxPool2d(2, 2), nn.Flatten(), nn.Linear(800, 500), nn.ReLU(),
                              nn.Linear(500, 10))
    elif net_name == "cifar10_quick":
        model = nn.Sequential(nn.Conv2d(3, 32, 5, padding=2), nn.MaxPool2d(3, 2, ceil_mode=True),
                              nn.ReLU(), nn.Conv2d(32, 32, 5, padding=2), nn.ReLU(),
                              nn.AvgPool2d(3, 2, ceil_mode=True), nn.Conv2d(32, 64, 5, padding=2),
                              nn.ReLU(), nn.AvgPool2d(3, 2, ceil_mode=True), nn.Flatten(),
                              nn.Linear(64 * 4 * 4, 64), nn.Linear(64, 10))
    else:
        model = nn.Sequential(
            nn.Conv2d(3, 96, 11, stride=4), nn.ReLU(), nn.LocalResponseNorm(5, 1e-4, 0.75),
            nn.MaxPool2d(3, 2, ceil_mode=True), nn.Conv2d(96, 256, 5, padding=2, groups=2),
            nn.ReLU(), nn.LocalResponseNorm(5, 1e-4, 0.75), nn.MaxPool2d(3, 2, ceil_mode=True),
            nn.Conv2d(256, 384, 3, padding=1), nn.ReLU(),
            nn.Conv2d(384, 384, 3, padding=1, groups=2), nn.ReLU(),
            nn.Conv2d(384, 256, 3, padding=1, groups=2), nn.ReLU(),
            nn.MaxPool2d(3, 2, ceil_mode=True), nn.Flatten(), nn.Linear(9216, 4096), nn.ReLU(),
            nn.Dropout(), nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout(), nn.Linear(4096, 1000))
    x = torch.randn((BATCH[net_name],) + INPUT[net_name])
    y = torch.ones(BATCH[net_name], dtype=torch.long)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        model.zero_grad()
        loss_fn(model(x), y).backward()
    step()
    return _measure(step, iters)


def _worker(args):
    if args.engine == "torch":
        result = _time_torch(args.worker, args.iters)
    else:
        result = _time_ours(args.worker, args.iters, args.profile)
    print("RESULT " + json.dumps(result))


# -- the driver --------------------------------------------------------------------------------
def _thread_env(threads):
    env = dict(os.environ)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    # machine-specific OpenBLAS overrides would distort the comparison
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    return env


def _run(python, net, threads, iters, engine, profile):
    cmd = [python, os.path.abspath(__file__), "--worker", net, "--iters", str(iters),
           "--engine", engine] + (["--profile"] if profile else [])
    proc = subprocess.run(cmd, env=_thread_env(threads), capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    sys.stderr.write("%s %s (%d threads) failed:\n%s\n" % (engine, net, threads, proc.stderr))
    return None


def _torch_python(requested):
    candidates = [requested] if requested else [sys.executable, "/tmp/torchvenv/bin/python"]
    for python in candidates:
        if python and os.path.exists(python) and subprocess.run(
                [python, "-c", "import torch"], capture_output=True).returncode == 0:
            return python
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--nets", default="lenet,cifar10_quick,alexnet")
    parser.add_argument("--torch", default=None, help="a python that can import torch")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--engine", default="ours", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args)
    torch_python = _torch_python(args.torch)
    print("ms per training iteration (best of %d; cpu = process CPU time)" % args.iters)
    print("%-14s %7s %18s %18s %7s %15s" % ("net", "threads", "ours wall/cpu", "torch wall/cpu",
                                             "ratio", "ref caffe/torch"))
    unknown = [n for n in args.nets.split(",") if n not in REFERENCE_1T]
    if unknown:
        parser.error("--nets takes %s, not %s" % (", ".join(REFERENCE_1T), ", ".join(unknown)))
    for net in args.nets.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            ours = _run(sys.executable, net, threads, args.iters, "ours", args.profile)
            theirs = (_run(torch_python, net, threads, args.iters, "torch", False)
                      if torch_python else None)
            ref = REFERENCE_1T[net] if threads == 1 else ("-", "-")
            key = "cpu_ms" if threads == 1 else "ms"    # one thread: CPU time, steadier
            ratio = "%.2f" % (ours[key] / theirs[key]) if ours and theirs else "-"
            print("%-14s %7d %18s %18s %7s %15s" % (
                net, threads, "%.1f / %.1f" % (ours["ms"], ours["cpu_ms"]) if ours else "failed",
                "%.1f / %.1f" % (theirs["ms"], theirs["cpu_ms"]) if theirs else "-", ratio,
                "%s / %s" % ref))
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


if __name__ == "__main__":
    main()
