"""Each layer of bench.py's nets against this machine's own limits.

    python scripts/roofline.py [--nets alexnet,vgg16,googlenet] [--threads 1,2] [--iters N]
                               [--json FILE] [--torch PYTHON]
    (also: python scripts/bench.py --roofline ...)

For each thread count, in a fresh process with OPENBLAS_NUM_THREADS (and the OMP / MKL
equivalents) set before numpy loads, it measures two limits of the machine:

  sgemm   numpy's float32 matmul at 2048x2048x2048 with BLAS on that many threads (best of 5)
  memory  bandwidth of a 256 MB copy, one slice per thread (bytes read + bytes written; best
          of 5)

and, for reading the memory-bound shares, a third figure that is no goal: the same bytes
through a pass that writes as the layers do (numpy's multiply by 1 into another array). A
large copy writes around the cache (non-temporal stores, on x86 at least); a pass writing
into the cache first reads each line it writes, a third more traffic, and on one core of an
AMD EPYC reaches 55-70% of the copy's rate (two threads, sharing the memory, near all of
it): a layer near that share is at what such a pass can do.

(each measured before and after the layers, the faster kept), then times each layer of a
training iteration, forward and backward, best of N iterations, and prints for every
Convolution and InnerProduct layer its achieved GFLOP/s as a share of the sgemm rate, and for
every memory-bound layer (Pooling, LRN, ReLU, Dropout, Eltwise, Concat, Softmax,
SoftmaxWithLoss) its GB/s as a share of the bandwidth.

The work counted is the least the layer must do, not what an algorithm does: a convolution's
multiply-adds of the direct method, 2 N M (C/group) taps outputs per pass (an FFT or
Winograd plan does fewer, so a share above 100% is possible); backward counts the filter
gradient, and the data gradient where the net propagates to the bottom. A memory-bound
layer's bytes are its inputs read and its outputs written once (backward: the top gradient
read, the bottom gradient written, and what the gradient needs of the forward: ReLU's input,
MAX pooling's winners, LRN's input and output, Softmax's output; Dropout needs nothing, its
draws being made again from a key).
Goals: convolutions overall at >= 70% of the sgemm rate, each memory-bound layer at >= 50% of
the bandwidth; the layers below are marked with '<'.

--torch PYTHON (a python that can import torch) adds a peer: each memory-bound layer's
PyTorch counterpart on the same shapes, timed alone, the best of a few calls in a row
(scripts/peer_layers.py), and ours timed the same way; their shares of the same bandwidth in
the last two columns ("alone", "PyTorch"), and the layers where PyTorch's took less time
named. Timed alone a small layer's data stays in the cache, as it does not in the flow.
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the nets, and the environment a worker runs in)
import peer_layers  # noqa: E402  (ours alone is timed as PyTorch's is)

GEMM_SIZE = 2048
COPY_BYTES = 256 * 1024 * 1024
CONV_GOAL = 0.70            # share of the sgemm rate, all convolutions of a net together
MEMORY_GOAL = 0.50          # share of the bandwidth, each memory-bound layer
FLOP_LAYERS = ("Convolution", "InnerProduct")
MEMORY_LAYERS = ("Pooling", "LRN", "ReLU", "Dropout", "Eltwise", "Concat", "Softmax",
                 "SoftmaxWithLoss")
DEFAULT_NETS = ("alexnet", "vgg16", "googlenet")
PEER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_layers.py")
PEER_CALLS = 5              # PyTorch's layers: best of at least this many calls


# -- the machine's limits ------------------------------------------------------------------
def sgemm_rate(threads, size=GEMM_SIZE, repeats=5):
    """GFLOP/s of numpy's float32 matmul at size^3 with BLAS on ``threads`` threads."""
    import numpy as np
    from poseidon_caffe.backend.cpu.threads import set_blas_threads
    set_blas_threads(threads)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    out = np.empty((size, size), dtype=np.float32)
    np.matmul(a, b, out=out)
    best = min(_seconds(lambda: np.matmul(a, b, out=out)) for _ in range(repeats))
    return 2.0 * size ** 3 / best / 1e9


def copy_bandwidth(threads, nbytes=COPY_BYTES, repeats=5):
    """GB/s (read + written) of a large copy, one contiguous slice per thread (numpy releases
    the GIL inside the copy, so the slices run side by side)."""
    import numpy as np
    return _slices_rate(threads, nbytes, repeats, lambda src, dst: np.copyto(dst, src))


def pass_bandwidth(threads, nbytes=COPY_BYTES, repeats=5):
    """copy_bandwidth's figure for a pass that writes through the cache as the layers do:
    dst = src * 1."""
    import numpy as np
    one = np.float32(1.0)
    return _slices_rate(threads, nbytes, repeats,
                        lambda src, dst: np.multiply(src, one, out=dst))


def _slices_rate(threads, nbytes, repeats, op):
    """GB/s (read + written) of op(src, dst) over nbytes of float32, one contiguous slice of
    each per thread, side by side: the best of ``repeats`` after one to warm up."""
    import numpy as np
    from concurrent.futures import ThreadPoolExecutor
    n = nbytes // 4
    src = np.ones(n, dtype=np.float32)
    dst = np.zeros(n, dtype=np.float32)
    bounds = [(n * i // threads, n * (i + 1) // threads) for i in range(threads)]
    with ThreadPoolExecutor(threads) as pool:
        def run():
            list(pool.map(lambda lh: op(src[lh[0]:lh[1]], dst[lh[0]:lh[1]]), bounds))
        run()
        best = min(_seconds(run) for _ in range(repeats))
    return 2.0 * nbytes / best / 1e9


def _seconds(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# -- the work each layer must do -----------------------------------------------------------
def layer_work(net, i):
    """("flops" | "bytes" | None, forward amount, backward amount) of layer ``i``; backward
    is 0 where the net runs no backward through the layer."""
    layer = net.layers[i]
    bottoms, tops = net.layer_blobs(i)
    needs = net.layer_need_backward[i]
    to_bottom = [bool(p) for p in net.bottom_need_backward[i]]
    if layer.type in FLOP_LAYERS:
        weight = layer.blobs[0]
        per_output = weight.count // weight.shape[0]          # (C/group) taps, or K
        outputs = sum(t.count for t in tops)                  # N M outputs (per position)
        forward = 2.0 * outputs * per_output
        backward = forward * (1 + any(to_bottom)) if needs else 0.0
        return "flops", forward, backward
    if layer.type in MEMORY_LAYERS:
        size = 4.0
        bottom_bytes = sum(b.count for b in bottoms) * size
        top_bytes = sum(t.count for t in tops) * size
        if layer.type == "SoftmaxWithLoss":
            bottom_bytes = bottoms[0].count * size          # the labels are a few bytes
            top_bytes = bottom_bytes                        # it writes the probabilities
        forward = bottom_bytes + top_bytes
        if not needs or not any(to_bottom):
            return "bytes", forward, 0.0
        kept = 0.0                                # what the gradient reads of the forward
        if layer.type == "ReLU":
            kept = bottom_bytes
        # Dropout's draws can be made again from a key (backend/dropout_bits.py): its least
        # backward reads the top gradient and writes the bottom's, nothing of the forward
        elif layer.type == "Pooling":
            from poseidon_caffe.proto import caffe_pb2
            if layer.param.pooling_param.pool == caffe_pb2.PoolingParameter.MAX:
                kept = top_bytes
        elif layer.type == "LRN":
            kept = bottom_bytes + top_bytes
        elif layer.type in ("Softmax", "SoftmaxWithLoss"):
            kept = top_bytes
        elif layer.type == "Eltwise" and layer.param.eltwise_param.operation != 1:
            kept = bottom_bytes                   # PROD and MAX read the inputs again
        grad_in = 0.0 if layer.type == "SoftmaxWithLoss" else top_bytes
        return "bytes", forward, grad_in + bottom_bytes + kept
    return None, 0.0, 0.0


def peer_operation(net, i):
    """Memory-bound layer ``i`` as peer_layers.py builds it in PyTorch: its type, its inputs'
    shapes, its parameters, and whether the net runs its backward."""
    layer = net.layers[i]
    bottoms, _ = net.layer_blobs(i)
    op = {"type": layer.type, "bottoms": [list(b.shape) for b in bottoms],
          "backward": bool(net.layer_need_backward[i]
                           and any(net.bottom_need_backward[i]))}
    if layer.type == "SoftmaxWithLoss":
        op["bottoms"] = op["bottoms"][:1]                # the labels are drawn there
        op["axis"] = layer.axis
    elif layer.type == "ReLU":
        op["slope"] = layer.slope
    elif layer.type == "Dropout":
        op["ratio"] = layer.param.dropout_param.dropout_ratio
    elif layer.type == "Pooling":
        op.update(method=layer.method, kernel=list(layer.kernel), stride=list(layer.stride),
                  pad=list(layer.pad))
    elif layer.type == "LRN":
        op.update(size=layer.size, alpha=layer.alpha, beta=layer.beta, k=layer.k,
                  across_channels=layer.across)
    elif layer.type in ("Concat", "Softmax"):
        op["axis"] = layer.axis
    elif layer.type == "Eltwise":
        op.update(operation=layer.op, coeffs=list(layer.coeffs))
    return op


def time_layers(net, iters):
    """[(forward s, backward s)] per layer, best of ``iters`` iterations."""
    best = [[float("inf"), float("inf")] for _ in net.layers]
    for _ in range(iters):
        net.clear_param_diffs()
        for i in range(len(net.layers)):
            best[i][0] = min(best[i][0], _seconds(lambda: net.forward_from_to(i, i)))
        for i in reversed(range(len(net.layers))):
            best[i][1] = min(best[i][1], _seconds(lambda: net.backward_from_to(i, i)))
    return best


def measure(net_name, threads, iters, gemm_size=GEMM_SIZE, copy_bytes=COPY_BYTES,
            alone_calls=0):
    """The limits and each layer's times and work, as a JSON-able dict (run in a worker
    whose thread environment is already set). With ``alone_calls`` (the peer asked for),
    each memory-bound layer is also described for peer_layers.py and timed alone, the best
    of that many calls in a row (as PyTorch's is), after the net's flow was timed."""
    limits = {"sgemm_gflops": sgemm_rate(threads, gemm_size),
              "copy_gbs": copy_bandwidth(threads, copy_bytes),
              "pass_gbs": pass_bandwidth(threads, copy_bytes)}
    net = bench._ours(net_name)                  # the backend sets BLAS threads as it runs
    net.share_diffs()
    net.forward_backward()                       # warm-up: buffers, plans
    times = time_layers(net, iters)
    # and again after the layers, keeping the faster: another process busy on the machine
    # during one measurement can only have slowed it, and a limit too low flatters every share
    limits["sgemm_gflops"] = max(limits["sgemm_gflops"], sgemm_rate(threads, gemm_size))
    limits["copy_gbs"] = max(limits["copy_gbs"], copy_bandwidth(threads, copy_bytes))
    limits["pass_gbs"] = max(limits["pass_gbs"], pass_bandwidth(threads, copy_bytes))
    layers = []
    for i, layer in enumerate(net.layers):
        kind, forward, backward = layer_work(net, i)
        if kind is None:
            continue
        plans = getattr(layer, "_plans", None)
        layers.append({"name": layer.param.name, "type": layer.type, "kind": kind,
                       "forward": forward, "backward": backward,
                       "forward_s": times[i][0], "backward_s": times[i][1],
                       "plan": _plan_name(plans[0]) if plans else ""})
        if kind == "bytes" and alone_calls:
            layers[-1]["peer_op"] = peer_operation(net, i)
            layers[-1]["alone_s"] = _alone(net, i, alone_calls, backward)
    return {"net": net_name, "threads": threads, "limits": limits, "layers": layers,
            "load": os.getloadavg()[0]}


def _alone(net, i, calls, backward):
    """[forward s, backward s] of layer ``i`` called again and again, its data warm (an
    in-place layer's repeated forward changes its blob's values: run after the flow)."""
    return [peer_layers.best_of(lambda: net.forward_from_to(i, i), calls),
            peer_layers.best_of(lambda: net.backward_from_to(i, i), calls) if backward
            else 0.0]


def _plan_name(plan):
    """The convolution algorithm a layer's plan runs (inside a batch-split or chunked plan,
    whose ``_plans`` hold (part size, plan) pairs or chunk size -> plan)."""
    inner = getattr(plan, "_plans", None)
    if isinstance(inner, dict):
        inner = list(inner.values())
    if inner:
        first = inner[0][1] if isinstance(inner[0], tuple) else inner[0]
        if first is not None:
            return _plan_name(first)
    name = type(plan).__name__
    if name == "ConvPlan":
        return "im2col"
    return name[:-len("ConvPlan")].lower() if name.endswith("ConvPlan") else name


# -- the report ------------------------------------------------------------------------------
def report(result, out=sys.stdout):
    """Print one (net, threads) result: each layer's rate and share, then the totals."""
    limits = result["limits"]
    gemm, copy = limits["sgemm_gflops"], limits["copy_gbs"]
    through = limits.get("pass_gbs")        # absent from the JSON of earlier versions
    out.write("%s, %d thread%s: sgemm %.1f GFLOP/s, copy %.1f GB/s%s, load %.2f\n" % (
        result["net"], result["threads"], "s" if result["threads"] > 1 else "", gemm, copy,
        " (a pass writing through the cache: %.1f GB/s, %.0f%%)" % (through,
                                                                  100 * through / copy)
        if through else "", result["load"]))
    peers = any("peer_s" in layer for layer in result["layers"])
    out.write("  %-24s %-16s %-10s %9s %9s %16s %16s%s\n" % (
        "layer", "type", "plan", "fwd ms", "bwd ms", "fwd rate/share", "bwd rate/share",
        "   %11s   %11s" % ("alone f/b", "PyTorch f/b") if peers else ""))
    totals = {"flops": [0.0, 0.0], "conv": [0.0, 0.0]}
    below, peer_faster = [], []
    for layer in result["layers"]:
        limit, unit = (gemm, "GF/s") if layer["kind"] == "flops" else (copy, "GB/s")
        cells = []
        for amount, seconds in ((layer["forward"], layer["forward_s"]),
                                (layer["backward"], layer["backward_s"])):
            if not amount or not seconds:
                cells.append("-")
                continue
            rate = amount / seconds / 1e9
            share = rate / limit
            mark = "<" if layer["kind"] == "bytes" and share < MEMORY_GOAL else " "
            if mark == "<":
                below.append(layer["name"])
            cells.append("%6.1f %s %3.0f%%%s" % (rate, unit, 100 * share, mark))
        if layer["type"] == "Convolution":
            totals["conv"][0] += layer["forward"] + layer["backward"]
            totals["conv"][1] += layer["forward_s"] + (layer["backward_s"]
                                                       if layer["backward"] else 0.0)
        peer = _peer_cells(layer, copy, peer_faster) if peers else ""
        out.write("  %-24s %-16s %-10s %9.2f %9.2f %16s %16s%s\n" % (
            layer["name"][:24], layer["type"][:16], layer["plan"][:10],
            1000 * layer["forward_s"], 1000 * layer["backward_s"], cells[0], cells[1], peer))
    flops, seconds = totals["conv"]
    if seconds:
        share = flops / seconds / 1e9 / gemm
        out.write("  convolutions overall: %.1f GFLOP/s, %.0f%% of sgemm%s\n" % (
            flops / seconds / 1e9, 100 * share,
            "" if share >= CONV_GOAL else " (below the %.0f%% goal)" % (100 * CONV_GOAL)))
    if below:
        out.write("  memory-bound below %.0f%% of the bandwidth: %s\n" % (
            100 * MEMORY_GOAL, ", ".join(sorted(set(below), key=below.index))))
    if peers:
        named = ", ".join(sorted(set(peer_faster), key=peer_faster.index)) or "none"
        out.write("  memory-bound where PyTorch's same operation alone is faster than ours "
                  "alone: %s\n" % named)


def _peer_cells(layer, copy, faster):
    """The report's last columns: ours alone and PyTorch's shares of the bandwidth, forward
    and backward; the layer's name goes into ``faster`` where PyTorch took less time than
    ours alone in a direction."""
    peer, alone = layer.get("peer_s"), layer.get("alone_s")
    if not peer or not alone:
        return "   %11s   %11s" % ("-", "-")
    cells = {"alone": [], "peer": []}
    for amount, ours, theirs in ((layer["forward"], alone[0], peer[0]),
                                 (layer["backward"], alone[1], peer[1])):
        if not amount or not ours or not theirs:
            cells["alone"].append("  -")
            cells["peer"].append("  -")
            continue
        cells["alone"].append("%3.0f" % (100 * amount / ours / 1e9 / copy))
        cells["peer"].append("%3.0f" % (100 * amount / theirs / 1e9 / copy))
        if theirs < ours:
            faster.append(layer["name"])
    return "   %11s   %11s" % ("/".join(cells["alone"]) + "%", "/".join(cells["peer"]) + "%")


def _worker(args):
    print("RESULT " + json.dumps(measure(args.worker, int(os.environ["OMP_NUM_THREADS"]),
                                         args.iters, args.gemm_size,
                                         args.copy_mb * 1024 * 1024, args.alone)))


def add_peer_times(result, python, threads, calls):
    """Each memory-bound layer of ``result`` gains ``peer_s`` (PyTorch's forward and backward
    seconds, or None where it has no counterpart), from peer_layers.py run by ``python``; a
    python that cannot run it leaves the result as it was and says so in one line."""
    import tempfile
    layers = [layer for layer in result["layers"] if "peer_op" in layer]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([layer["peer_op"] for layer in layers], f)
    try:
        proc = subprocess.run([python, PEER_SCRIPT, "--worker", f.name, str(calls),
                               str(threads)], env=bench._thread_env(threads),
                              capture_output=True, text=True)
    except OSError as e:
        proc = None
        why = str(e)
    finally:
        os.unlink(f.name)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")] if proc else []
    if not lines:
        if proc is not None:
            tail = proc.stderr.strip().splitlines()
            why = tail[-1] if tail else "exit status %d" % proc.returncode
        sys.stderr.write("roofline: PyTorch's layers not timed with %s (%s, %d threads): %s\n"
                         % (python, result["net"], threads, why))
        return
    for layer, seconds in zip(layers, json.loads(lines[-1][7:])):
        layer["peer_s"] = seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default=",".join(DEFAULT_NETS))
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--iters", type=int, default=None,
                        help="best of N iterations per layer (default: bench.py's per net)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--gemm-size", type=int, default=GEMM_SIZE,
                        help="the sgemm's side (default %(default)s)")
    parser.add_argument("--copy-mb", type=int, default=COPY_BYTES // (1024 * 1024),
                        help="MiB copied to measure the bandwidth (default %(default)s)")
    parser.add_argument("--torch", metavar="PYTHON",
                        help="a python that can import torch: each memory-bound layer's "
                             "PyTorch counterpart timed beside ours (scripts/peer_layers.py)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--alone", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args)
    nets = args.nets.split(",")
    unknown = [n for n in nets if n not in bench.NETS]
    if unknown:
        parser.error("--nets takes %s, not %s" % (", ".join(bench.NETS), ", ".join(unknown)))
    results = []
    for net in nets:
        for threads in (int(t) for t in args.threads.split(",")):
            iters = args.iters or bench.ITERS[net]
            calls = max(PEER_CALLS, iters)
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", net,
                                   "--iters", str(iters), "--gemm-size", str(args.gemm_size),
                                   "--copy-mb", str(args.copy_mb),
                                   "--alone", str(calls if args.torch else 0)],
                                  env=bench._thread_env(threads),
                                  capture_output=True, text=True)
            lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
            if not lines:
                sys.stderr.write("%s (%d threads) failed:\n%s\n" % (
                    net, threads, "\n".join(proc.stderr.splitlines()[-15:])))
                continue
            result = json.loads(lines[-1][7:])
            if args.torch:
                add_peer_times(result, args.torch, threads, calls)
            results.append(result)
            report(result)
            sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
