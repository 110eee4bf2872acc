"""Time training iterations of LeNet, CIFAR-10 quick, AlexNet and GoogLeNet on a GPU, ours
beside PyTorch CUDA (cuDNN) in the same run, with per-layer times and the convolutions' rate
against the device's cuBLAS sgemm rate measured in the same run.

    python scripts/bench_gpu.py [--nets lenet,cifar10_quick,alexnet,googlenet] [--iters N]
                                [--device ID] [--batch net=N ...] [--gemm-size 4096]
                                [--json FILE] [--save-nets DIR]

The nets are scripts/bench.py's (the same prototxt and PyTorch translation), TRAIN phase,
DummyData input drawn once; the default batches are lenet 64, cifar10_quick 100, alexnet 128,
googlenet 32. One iteration is what bench.py times: clear the parameter diffs, forward,
backward (no solver update), on both sides. The device is synchronised before every clock
read. A convolution's work is 2 N M (C/group) kh kw outH outW flops forward and twice that
backward (data and weight gradients; once for a layer whose input needs no gradient); its rate over its measured time is printed as a share
of the sgemm rate (square n x n float32 matrices, 2 n^3 flops).

Beside those times it trains each net with the SGD solver, display off, synchronising only
around the run: ``train ms`` per iteration (with the update) and ``waits/iter``, the host's
waits for the device per training iteration as the driver counts them (synchronize, stream
and event waits, copies to the host, BLAS scalars), the loss read at the end left out. The
goal is none: the only wait of a training iteration is the loss read at display.

The JSON report is also a compute file for ``poseidon-caffe simulate -compute FILE``: its
per-layer times, for the net whose layers the simulated net has. ``--save-nets DIR`` writes
each timed net there as ``NET.prototxt`` (at the batch timed), the ``-model`` that goes with
them (docs/SIMULATION.md).

With POSEIDON_CAFFE_GPU=emulated it runs on the emulated device (a smoke check: its times are
host times, not GPU times, and it says so).
"""
import argparse
import importlib.util
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

BATCH = {"lenet": 64, "cifar10_quick": 100, "alexnet": 128, "googlenet": 32}
NETS = tuple(BATCH)


def _load_bench():
    """scripts/bench.py as a module: the net definitions are its own."""
    spec = importlib.util.spec_from_file_location(
        "bench", os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load_bench()


def _param(net, batch):
    """bench.py's TRAIN prototxt of ``net`` with its DummyData batch set to ``batch``."""
    from google.protobuf import text_format
    from poseidon_caffe.proto import caffe_pb2
    param = text_format.Parse(bench.net_prototxt(net), caffe_pb2.NetParameter())
    for layer in param.layer:
        if layer.type == "DummyData":
            for shape in layer.dummy_data_param.shape:
                shape.dim[0] = batch
    return param


def _input(net, batch, seed=1):
    import numpy as np
    return np.random.default_rng(seed).standard_normal(
        (batch,) + bench.INPUT[net], dtype=np.float32)


def _stats(seconds):
    return {"ms": 1000 * min(seconds), "mean_ms": 1000 * sum(seconds) / len(seconds)}


# -- ours --------------------------------------------------------------------------------------
def _sync_clock(backend):
    def clock():
        backend.synchronize()
        return time.perf_counter()
    return clock


def sgemm_rate(backend, n, reps):
    """GFLOP/s of the backend's gemm on square n x n float32 matrices, best of ``reps``."""
    import numpy as np
    rng = np.random.default_rng(0)
    a = backend.to_device(rng.standard_normal((n, n), dtype=np.float32))
    b = backend.to_device(rng.standard_normal((n, n), dtype=np.float32))
    out = backend.empty((n, n))
    clock = _sync_clock(backend)
    backend.gemm(a, b, out=out)                 # warm-up: the handle, the library's kernels
    times = []
    for _ in range(reps):
        t0 = clock()
        backend.gemm(a, b, out=out)
        times.append(clock() - t0)
    best = min(times)
    return {"n": n, "ms": 1000 * best, "gflops": 2.0 * n ** 3 / best / 1e9}


def conv_flops(net, i):
    """Forward flops of convolution layer ``i`` of ``net`` (each backward gradient: as many)."""
    p = net.layers[i].param.convolution_param
    bottom, top = net.bottom_vecs[i][0].shape, net.top_vecs[i][0].shape
    if p.kernel_h or p.kernel_w:
        kh, kw = p.kernel_h, p.kernel_w
    else:
        kh = p.kernel_size[0]
        kw = p.kernel_size[1] if len(p.kernel_size) > 1 else kh
    n, c = bottom[0], bottom[1]
    m, out_h, out_w = top[1], top[2], top[3]
    return 2.0 * n * m * (c // max(p.group, 1)) * kh * kw * out_h * out_w


def time_ours(net_name, batch, iters):
    from poseidon_caffe import backend as backends
    from poseidon_caffe.net import Net
    from poseidon_caffe.net.timing import time_layers
    from poseidon_caffe.proto import caffe_pb2
    be = backends.get_backend()
    clock = _sync_clock(be)
    net = Net(_param(net_name, batch), caffe_pb2.TRAIN)
    net.blobs["data"].data[...] = _input(net_name, batch)
    net.forward_backward()                      # warm-up: buffers, plans, kernel loads
    times = []
    for _ in range(iters):
        t0 = clock()
        net.clear_param_diffs()
        net.forward_backward()
        times.append(clock() - t0)
    result = _stats(times)
    per = time_layers(net, iters, clock=clock)
    layers = []
    for i, layer in enumerate(net.layers):
        row = {"name": net.layer_names[i], "type": layer.type,
               "forward_ms": 1000 * per["forward"][i] / iters,
               "backward_ms": 1000 * per["backward"][i] / iters}
        if layer.type == "Convolution":
            # backward: the weight gradient, and the data gradient unless the bottom needs
            # none (the first convolution's input)
            passes = 1 + bool(net.bottom_need_backward[i][0])
            row["forward_gflop"] = conv_flops(net, i) / 1e9
            row["backward_gflop"] = passes * row["forward_gflop"]
        layers.append(row)
    result["layers"] = layers
    return result


class _IterationMarks:
    """pycaffe's solver callback that notes the device's transfer counts as each iteration
    starts."""

    def __init__(self, backend):
        self.backend = backend
        self.marks = []

    def on_start(self):
        self.marks.append(self.backend.transfers_now())

    def on_gradients_ready(self):
        pass


def train_waits(net_name, batch, iters, display=0):
    """A timed training run: the SGD solver steps ``iters + 1`` iterations of the net with
    display off (or every ``display`` iterations), the device synchronised only before and
    after. Returns the ms per iteration and the computation's waits for the device per
    iteration, counted by the driver from the start of the first iteration to the start of
    the last (so the loss read at the end of the step falls outside): the goal is none but
    the loss read of a display."""
    from poseidon_caffe import backend as backends
    from poseidon_caffe.proto import caffe_pb2
    from poseidon_caffe.solver import get_solver
    be = backends.get_backend()
    clock = _sync_clock(be)
    param = caffe_pb2.SolverParameter(base_lr=0.001, momentum=0.9, lr_policy="fixed",
                                      display=display, max_iter=1 << 30, random_seed=1,
                                      snapshot_after_train=False)
    param.net_param.CopyFrom(_param(net_name, batch))
    solver = get_solver(param)
    solver.step(2)                              # warm-up: buffers, history, loss rows
    marks = _IterationMarks(be)
    solver.add_callback(marks)
    t0 = clock()
    solver.step(iters + 1)
    seconds = clock() - t0
    moved = marks.marks[-1].since(marks.marks[0])
    return {"train_ms": 1000 * seconds / (iters + 1),
            "host_waits_per_iter": moved.host_syncs / iters,
            "background_waits_per_iter": moved.background_syncs / iters}


# -- PyTorch -----------------------------------------------------------------------------------
def torch_cuda(device):
    """torch, when it is importable and sees a CUDA device; else None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or device >= torch.cuda.device_count():
        return None
    return torch


def time_torch(torch, net_name, batch, iters, device):
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda", device)
    layers = bench.torch_layers(net_name) if net_name == "googlenet" else None
    if layers is not None:
        model = bench._torch_graph(layers, batch, bench.INPUT[net_name])
    else:
        model = bench._torch_model(net_name, None)
    model = model.to(dev)
    x = torch.from_numpy(_input(net_name, batch)).to(dev)
    y = torch.ones(batch, dtype=torch.long, device=dev)

    def step():
        model.zero_grad()
        model(x, y).backward()

    def clock():
        torch.cuda.synchronize(dev)
        return time.perf_counter()
    step()
    step()                                       # cudnn.benchmark picks its algorithms first
    times = []
    for _ in range(iters):
        t0 = clock()
        step()
        times.append(clock() - t0)
    return _stats(times)


# -- the report --------------------------------------------------------------------------------
def conv_shares(layers, gemm_gflops):
    """Each convolution's achieved GFLOP/s forward and backward and their share of the sgemm
    rate (set on the rows), and the share of all convolutions together."""
    flops = seconds = 0.0
    for row in layers:
        if "forward_gflop" not in row:
            continue
        for side in ("forward", "backward"):
            ms = row[side + "_ms"]
            rate = row[side + "_gflop"] / (ms / 1000) if ms > 0 else float("inf")
            row[side + "_gflops"] = rate
            row[side + "_share"] = rate / gemm_gflops
            flops += row[side + "_gflop"]
            seconds += ms / 1000
    if not seconds:
        return None
    return flops / seconds / gemm_gflops


def _print_layers(name, layers):
    print("\n%s per layer (ms; convolutions: GFLOP/s and share of sgemm)" % name)
    print("  %-28s %-16s %9s %9s %18s %18s" % ("layer", "type", "fwd", "bwd", "fwd GFLOP/s",
                                              "bwd GFLOP/s"))
    for row in layers:
        extra = ""
        if "forward_gflops" in row:
            extra = "%10.1f (%3.0f%%) %10.1f (%3.0f%%)" % (
                row["forward_gflops"], 100 * row["forward_share"],
                row["backward_gflops"], 100 * row["backward_share"])
        print("  %-28s %-16s %9.3f %9.3f  %s" % (row["name"][:28], row["type"][:16],
                                                 row["forward_ms"], row["backward_ms"], extra))


def parse_batches(items):
    batches = dict(BATCH)
    for item in items:
        name, _, value = item.partition("=")
        if name not in BATCH or not value.isdigit() or int(value) < 1:
            raise SystemExit("--batch %r: expected NET=N with NET one of %s and N >= 1"
                             % (item, ", ".join(NETS)))
        batches[name] = int(value)
    return batches


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default=",".join(NETS))
    parser.add_argument("--iters", type=int, default=10, help="timed iterations (best of)")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--batch", action="append", default=[], metavar="NET=N")
    parser.add_argument("--gemm-size", type=int, default=4096)
    parser.add_argument("--gemm-reps", type=int, default=10)
    parser.add_argument("--json", help="write every figure to this file (also a compute "
                                       "file for poseidon-caffe simulate)")
    parser.add_argument("--save-nets", metavar="DIR",
                        help="write each timed net to DIR/NET.prototxt (simulate's -model)")
    args = parser.parse_args(argv)
    nets = [n for n in args.nets.split(",") if n]
    unknown = [n for n in nets if n not in BATCH]
    if unknown:
        raise SystemExit("--nets: unknown %s; expected some of %s"
                         % (", ".join(unknown), ", ".join(NETS)))
    if args.iters < 1 or args.gemm_size < 1 or args.gemm_reps < 1:
        raise SystemExit("--iters, --gemm-size and --gemm-reps must be >= 1")
    batches = parse_batches(args.batch)
    import logging
    import poseidon_caffe.log   # noqa: F401  (sets its level on import: quieten it after)
    logging.getLogger("poseidon_caffe").setLevel(logging.WARNING)   # no net-setup lines

    from poseidon_caffe import backend as backends
    try:
        backends.set_device(args.device)
        backends.set_mode_gpu()
    except backends.GPUUnavailable as exc:
        raise SystemExit("GPU mode unavailable: %s" % exc)
    be = backends.get_backend()
    info = be.driver.info
    print("Device %d: %s (compute %s, %d multiprocessors)"
          % (args.device, info.name, ".".join(map(str, info.compute_capability)),
             info.multiprocessors))
    if info.emulated:
        print("EMULATED DEVICE: the times below are host times of the emulation, "
              "not GPU times")
    gemm = sgemm_rate(be, args.gemm_size, args.gemm_reps)
    print("sgemm %dx%d: %.3f ms, %.1f GFLOP/s" % (gemm["n"], gemm["n"], gemm["ms"],
                                                  gemm["gflops"]))
    torch = torch_cuda(args.device)
    if torch is None:
        print("PyTorch CUDA: not available")
    else:
        print("PyTorch %s, CUDA device %s, cuDNN %s" % (
            torch.__version__, torch.cuda.get_device_name(args.device),
            torch.backends.cudnn.version()))

    report = {"device": info.name, "device_id": args.device, "emulated": bool(info.emulated),
              "iters": args.iters, "sgemm": gemm,
              "torch": None if torch is None else torch.__version__, "nets": {}}
    for name in nets:
        ours = time_ours(name, batches[name], args.iters)
        row = {"batch": batches[name], "ours_ms": ours["ms"], "ours_mean_ms": ours["mean_ms"],
               **train_waits(name, batches[name], args.iters),
               "torch_ms": None, "torch_mean_ms": None, "ratio": None,
               "conv_share": conv_shares(ours["layers"], gemm["gflops"]),
               "layers": ours["layers"]}
        if torch is not None:
            theirs = time_torch(torch, name, batches[name], args.iters, args.device)
            row.update(torch_ms=theirs["ms"], torch_mean_ms=theirs["mean_ms"],
                       ratio=ours["ms"] / theirs["ms"])
        report["nets"][name] = row
        _print_layers("%s b%d" % (name, batches[name]), ours["layers"])

    print("\n%-14s %6s %11s %11s %8s %12s %10s %11s" % (
        "net", "batch", "ours ms", "PyTorch ms", "ratio", "conv/sgemm", "train ms",
        "waits/iter"))
    for name, row in report["nets"].items():
        print("%-14s %6d %11.2f %11s %8s %12s %10.2f %11g" % (
            name, row["batch"], row["ours_ms"],
            "-" if row["torch_ms"] is None else "%.2f" % row["torch_ms"],
            "-" if row["ratio"] is None else "%.2fx" % row["ratio"],
            "-" if row["conv_share"] is None else "%.0f%%" % (100 * row["conv_share"]),
            row["train_ms"], row["host_waits_per_iter"]))
    print("train ms: a solver iteration (with the update), synchronised only around the run; "
          "waits/iter: the host's waits for the device per training iteration, display off")
    print("goals: convolutions >= 50% of the sgemm rate; alexnet within 2x of PyTorch; "
          "0 waits per iteration")
    if info.emulated:
        print("(emulated device: not GPU times)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.save_nets:
        from google.protobuf import text_format
        os.makedirs(args.save_nets, exist_ok=True)
        for name in nets:
            with open(os.path.join(args.save_nets, name + ".prototxt"), "w") as f:
                f.write(text_format.MessageToString(_param(name, batches[name])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
