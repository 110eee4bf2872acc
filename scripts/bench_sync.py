"""Benchmark of the sync engine: iteration time with wait-free backprop on and off, the share of
communication it hides, and the bytes each host moves against the plan's prediction, for
LeNet (MNIST shapes, batch 64), Caffe's CIFAR-10 quick net (batch 50) and AlexNet (227 x 227,
batch 8 per worker); and SACP's choice against every forced mode.

Where the ranks run:
  (default)           on this machine over loopback, ranks playing hosts (ranks_per_host=1):
                      every exchange is a shared-memory copy (--hosts 2,4).
  --netlab H[,H...]   across H hosts of a shaped network on this machine (scripts/netlab.py:
                      network namespaces through a bridge, every link shaped with tc; root
                      needed), one rank per host, links at --bandwidth RATE (tc's spelling:
                      100mbit, 1gbit, 12.5MB/s) or `auto`: per net and host count, the rate at
                      which the planned bytes of -sync=auto take as long as the backward pass
                      of the same ranks computing alone.

Each configuration runs --repeat times, DWBP on and off interleaved, and keeps the fastest;
a run is --warmup iterations, then --iters measured ones. BLAS gets the machine's cores
shared among the ranks (the same in every mode): hosts that share this machine's cores are
contended, which is said in the output with the machine's load.

Definitions (per net, host count and mode; JSON field names):
  iter_ms_dwbp_on / iter_ms_dwbp_off   wall time per measured iteration, the slowest rank's.
  compute_ms, backward_ms              the same ranks training alone (no exchange): iteration
                                       and backward time per iteration.
  hidden_share     from the timelines (-timeline) of every rank, over the measured iterations,
                   DWBP on: the time during which some exchange was in flight on the
                   communication thread AND the compute thread was inside a layer's forward or
                   backward, divided by the time during which some exchange was in flight
                   (summed over the ranks). An exchange is in flight from the moment the
                   communication thread starts it until its last request completes, so time a
                   fast rank spends waiting for a slow one counts as communication, and time
                   when compute and communication share a core counts as hidden (then
                   hidden_share_iter tells the real gain).
  hidden_share_off the same with DWBP off (near 0 by construction: a check of the measure).
  hidden_share_iter  1 - (iter_ms_dwbp_on - compute_ms) / (iter_ms_dwbp_off - compute_ms):
                   the share of the communication's cost that DWBP removed from the iteration.
  exposed_ms_on / exposed_ms_off / exposed_ms_alone  per iteration, wall time minus the
                   compute thread's time inside layers (timeline; the median over the measured
                   iterations, averaged over the ranks; alone: iteration minus forward and
                   backward, the solver's own work). Unlike iteration times these do not move
                   when other jobs on the machine slow the layers down.
  hidden_share_exposed  1 - (exposed_ms_on - exposed_ms_alone) / (exposed_ms_off -
                   exposed_ms_alone): the same share as hidden_share_iter, from the exposed
                   times of the same runs.
  stall_ms_on / stall_ms_off   the compute thread's waits for the communication per iteration
                   (the engine's wait_seconds over the measured iterations), and copy_ms_on
                   its copies of gradients handed over (timeline spans "sync").
  cpu_ms_per_rank_on / _off  CPU time (user and system) of a rank's process per measured
                   iteration; comm_thread_cpu_ms_on the communication thread's part of it.
                   On this machine every host's TCP stack and sync work share the same cores
                   as the layers, so what DWBP overlaps can come back as slower layers.
  machine_busy_on / _off  the ranks' CPU time over the machine's: cpu_ms_per_rank x hosts /
                   (cores x iteration). Near 1, the iteration is as short as these cores
                   allow, whatever is left to hide.
  engine           after: this tree's engine, a channel per bucket; after<N>: with N channels;
                   before: --before's tree.
  wire_bytes_per_iter  bytes a host's link carried (sent plus received, Ethernet/IP/TCP
                   headers included; the namespace's interface counters, read by each rank
                   around the measured iterations), averaged over the hosts; null on loopback.
  engine_bytes_per_iter  what the engine's byte counters say a host sent plus received.
  predicted_bytes_per_iter  the planner's per-host prediction (sum over the blobs).

    python scripts/bench_sync.py [--nets lenet,cifar,alexnet] [--hosts 2,4]
        [--netlab H[,H]] [--bandwidth RATE|auto] [--mtu 1500] [--modes auto]
        [--batch NET=B[,NET=B]]
        [--iters 10] [--warmup 3]
        [--alexnet-iters 5] [--repeat 1] [--channels 0[,4,1]] [--before DIR]
        [--before-channels 1] [--sacp] [--sacp-nets alexnet,alexnet_cifar]
        [--sacp-modes auto,ps,sfb,allreduce]
        [--sacp-bandwidth RATE[,RATE]] [--sacp-iters 3] [--json FILE] [--pythonpath DIR]
        [--traces DIR]
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = r'''
import json, os, sys, time, types
cfg = json.load(open(sys.argv[1]))
import poseidon_caffe  # first: it gives each rank its share of the cores before numpy loads
import numpy as np
from mpi4py import MPI
from google.protobuf import text_format
from poseidon_caffe import sync
from poseidon_caffe.proto import caffe_pb2
from poseidon_caffe.solver import get_solver
comm = MPI.COMM_WORLD


def wire_bytes():
    """Sent plus received bytes of this network namespace's interfaces but lo."""
    total = 0
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, values = line.split(":", 1)
            if name.strip() != "lo":
                fields = values.split()
                total += int(fields[0]) + int(fields[8])
    return total


sp = caffe_pb2.SolverParameter()
text_format.Merge('base_lr: 0.001 momentum: 0.9 lr_policy: "fixed" display: 0 '
                  'random_seed: 1 max_iter: 100000', sp)
text_format.Merge(open(cfg["net"]).read(), sp.net_param)
solver = get_solver(sp)
net = solver.net
runner = None
if cfg["mode"] != "none":
    runner = sync.attach(solver, types.SimpleNamespace(
        sync=cfg["mode"], dwbp=cfg["dwbp"], svb=None, ranks_per_host=1,
        comm_channels=cfg["channels"], timeline=cfg["timeline"]))
phases = {"forward": 0.0, "backward": 0.0}
if runner is None:
    def timing(kind, layer, start, end):
        phases[kind] += end - start
    net.set_layer_timing_hook(timing)
rng = np.random.default_rng(comm.rank)
net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].shape)
net.blobs["label"].data[...] = rng.integers(0, 10, net.blobs["label"].shape)
solver.step(cfg["warmup"])
if runner:
    runner.engine.sync_point()
comm.Barrier()
phases = dict.fromkeys(phases, 0.0)
timeline = runner.timeline if runner else None
window = [timeline.now_us() if timeline else 0.0]
stall0 = runner.engine.wait_seconds if runner else 0.0
wire0, cpu0, t0 = wire_bytes(), time.process_time(), time.perf_counter()
solver.step(cfg["iters"])
if runner:
    runner.engine.sync_point()
seconds = (time.perf_counter() - t0) / cfg["iters"]
cpu = (time.process_time() - cpu0) / cfg["iters"]
wire = (wire_bytes() - wire0) / cfg["iters"]
window.append(timeline.now_us() if timeline else 0.0)
stall = ((runner.engine.wait_seconds - stall0) / cfg["iters"]) if runner else 0.0
result = {"seconds": seconds, "cpu_seconds": cpu, "wire": wire, "window_us": window,
          "iterations": cfg["iters"] + cfg["warmup"],
          "stall": stall,
          "forward": phases["forward"] / cfg["iters"],
          "backward": phases["backward"] / cfg["iters"]}
if runner:
    runner.finish()
    st = runner.engine.stats()
    result["engine_bytes"] = sum(r["sent"] + r["received"] for r in st["measured"].values())
    result["predicted"] = sum(st["predicted"].values())
    result["plan"] = st["plan"]
    for key in ("in_flight_peak", "overlapped_exchanges", "exchanges", "channels",
                "comm_polls", "comm_cpu_seconds"):
        result[key] = st.get(key)
elif comm.rank == 0 and cfg.get("plan_for"):
    # the bytes the planner would predict, for choosing a link rate (no exchange here)
    from poseidon_caffe.sync.net_items import build_items
    from poseidon_caffe.sync.planner import make_plan
    items = build_items(net)
    hosts = cfg["plan_for"]
    _, predicted = make_plan(items, "auto",
                             lambda it: it.sfb.rows_per_pass if it.sfb else 1,
                             (hosts, hosts, 1), announce=False)
    result["predicted_auto"] = sum(predicted.values())
res = comm.gather(result, root=0)
if comm.rank == 0:
    json.dump(res, open(cfg["out"], "w"))
'''

LENET = """
name: "LeNet"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 64 dim: 1 dim: 28 dim: 28 } } }
layer { name: "label" type: "Input" top: "label" input_param { shape { dim: 64 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 20 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2" convolution_param { num_output: 50 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1" inner_product_param { num_output: 500 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""

CIFAR = """
name: "CIFAR10_quick"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 50 dim: 3 dim: 32 dim: 32 } } }
layer { name: "label" type: "Input" top: "label" input_param { shape { dim: 50 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 32 pad: 2 kernel_size: 5 weight_filler { type: "gaussian" std: 0.0001 } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "relu1" type: "ReLU" bottom: "pool1" top: "pool1" }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2" convolution_param { num_output: 32 pad: 2 kernel_size: 5 weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer { name: "conv3" type: "Convolution" bottom: "pool2" top: "conv3" convolution_param { num_output: 64 pad: 2 kernel_size: 5 weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "relu3" type: "ReLU" bottom: "conv3" top: "conv3" }
layer { name: "pool3" type: "Pooling" bottom: "conv3" top: "pool3" pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool3" top: "ip1" inner_product_param { num_output: 64 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" inner_product_param { num_output: 10 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


def _conv(name, bottom, out, kernel, stride=1, pad=0, group=1, std=0.01):
    return ('layer { name: "%s" type: "Convolution" bottom: "%s" top: "%s" convolution_param '
            '{ num_output: %d kernel_size: %d stride: %d pad: %d group: %d weight_filler '
            '{ type: "gaussian" std: %g } } }\n'
            'layer { name: "relu_%s" type: "ReLU" bottom: "%s" top: "%s" }\n'
            % (name, bottom, name, out, kernel, stride, pad, group, std, name, name, name))


def _pool(name, bottom):
    return ('layer { name: "%s" type: "Pooling" bottom: "%s" top: "%s" pooling_param '
            '{ pool: MAX kernel_size: 3 stride: 2 } }\n' % (name, bottom, name))


def _lrn(name, bottom):
    return ('layer { name: "%s" type: "LRN" bottom: "%s" top: "%s" lrn_param '
            '{ local_size: 5 alpha: 0.0001 beta: 0.75 } }\n' % (name, bottom, name))


def _fc(name, bottom, out, relu_drop=True, std=0.005):
    text = ('layer { name: "%s" type: "InnerProduct" bottom: "%s" top: "%s" '
            'inner_product_param { num_output: %d weight_filler { type: "gaussian" std: %g } } }\n'
            % (name, bottom, name, out, std))
    if relu_drop:
        text += ('layer { name: "relu_%s" type: "ReLU" bottom: "%s" top: "%s" }\n'
                 'layer { name: "drop_%s" type: "Dropout" bottom: "%s" top: "%s" '
                 'dropout_param { dropout_ratio: 0.5 } }\n' % ((name,) * 6))
    return text


def alexnet(batch=8):
    """The ImageNet net of Krizhevsky et al. as Caffe trains it: five convolutions (two of
    them grouped), LRN, three fully connected layers (61 M weights, 96% in fc6-fc8)."""
    return ('name: "AlexNet"\n'
            'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: %d '
            'dim: 3 dim: 227 dim: 227 } } }\n'
            'layer { name: "label" type: "Input" top: "label" input_param { shape { dim: %d } } }\n'
            % (batch, batch)
            + _conv("conv1", "data", 96, 11, stride=4) + _lrn("norm1", "conv1")
            + _pool("pool1", "norm1")
            + _conv("conv2", "pool1", 256, 5, pad=2, group=2) + _lrn("norm2", "conv2")
            + _pool("pool2", "norm2")
            + _conv("conv3", "pool2", 384, 3, pad=1)
            + _conv("conv4", "conv3", 384, 3, pad=1, group=2)
            + _conv("conv5", "conv4", 256, 3, pad=1, group=2) + _pool("pool5", "conv5")
            + _fc("fc6", "pool5", 4096) + _fc("fc7", "fc6", 4096)
            + _fc("fc8", "fc7", 1000, relu_drop=False, std=0.01)
            + 'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc8" bottom: "label" '
              'top: "loss" }\n')


def alexnet_cifar(batch=64):
    """AlexNet's shape at CIFAR-10's size: the three convolutions of Caffe's CIFAR-10 quick
    net, then fc6 and fc7 of 4096 with ReLU and dropout, and a 10-way fc8. At 64 images a host
    SACP sends fc6 and fc7 as sufficient factors but fc8 through the servers: its 4096 x 10
    matrix is smaller than 64 rows of 4106 factors."""
    text = CIFAR.replace("CIFAR10_quick", "AlexNet_CIFAR10").replace("dim: 50", "dim: %d" % batch)
    head = text[:text.index('layer { name: "ip1"')]
    return (head + _fc("fc6", "pool3", 4096) + _fc("fc7", "fc6", 4096)
            + _fc("fc8", "fc7", 10, relu_drop=False, std=0.01)
            + 'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc8" bottom: "label" '
              'top: "loss" }\n')


NETS = {"lenet": ("LeNet", LENET), "cifar": ("CIFAR-10 quick", CIFAR),
        "alexnet": ("AlexNet b8", alexnet(8)),
        "alexnet_cifar": ("AlexNet-CIFAR b64", alexnet_cifar(64))}


def net_at_batch(key, batch=None):
    """(name, prototxt) of NETS[key], its inputs at ``batch`` images a worker when given."""
    name, text = NETS[key]
    if batch is None:
        return name, text
    text = re.sub(r"(input_param \{ shape \{ dim: )\d+", r"\g<1>%d" % batch, text)
    return "%s b%d" % (re.sub(r" b\d+$", "", name), batch), text


def parse_batches(text):
    """--batch lenet=256,cifar=100 -> {"lenet": 256, "cifar": 100}."""
    batches = {}
    for part in [p for p in text.split(",") if p]:
        key, _, value = part.partition("=")
        if key not in NETS or not value.isdigit() or int(value) < 1:
            raise SystemExit("--batch %s: expected NET=IMAGES with NET one of %s"
                             % (part, ", ".join(NETS)))
        batches[key] = int(value)
    return batches


class Runner:
    """Starts the worker on H ranks: over loopback, or across a lab of H shaped hosts."""

    def __init__(self, tmp, pythonpath, lab=None, traces=""):
        self.tmp = tmp
        self.traces = traces
        self.lab = lab
        self.pythonpath = pythonpath
        self.worker = os.path.join(tmp, "worker.py")
        with open(self.worker, "w") as f:
            f.write(WORKER)
        self.count = 0

    def run(self, net_text, hosts, mode, dwbp=True, iters=10, warmup=3, channels=4,
            plan_for=None, pythonpath=None):
        self.count += 1
        tag = "run%d" % self.count
        net_path = os.path.join(self.tmp, tag + ".prototxt")
        with open(net_path, "w") as f:
            f.write(net_text)
        out = os.path.join(self.tmp, tag + ".json")
        timeline = os.path.join(self.tmp, tag + ".trace.json") if mode != "none" else ""
        cfg = {"net": net_path, "mode": mode, "dwbp": dwbp, "iters": iters, "warmup": warmup,
               "channels": channels, "timeline": timeline, "out": out, "plan_for": plan_for}
        cfg_path = os.path.join(self.tmp, tag + ".cfg.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        threads = str(max(1, (os.cpu_count() or 1) // hosts))
        env = dict(os.environ, POSEIDON_NO_PROGRESS="1",
                   PYTHONPATH=pythonpath or self.pythonpath,
                   OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads,
                   MKL_NUM_THREADS=threads)
        mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        argv = [mpiexec]
        if self.lab is not None and mode != "none":
            argv += ["-hosts", ",".join("%s:1" % a for a in self.lab.addresses)]
        argv += ["-n", str(hosts), sys.executable, self.worker, cfg_path]
        if self.lab is not None and mode != "none":
            env = self.lab.env(env)
            argv = self.lab.command(argv)
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
        if proc.returncode:
            raise SystemExit("a run failed (%s, %d hosts, %s):\n%s"
                             % (mode, hosts, "dwbp" if dwbp else "no dwbp",
                                proc.stderr[-3000:]))
        with open(out) as f:
            ranks = json.load(f)
        if timeline:
            stem, ext = os.path.splitext(timeline)
            label = "%s-%dh-%s-%s-%s" % (net_text.split('"')[1], hosts, mode,
                                         "on" if dwbp else "off", tag)
            for r, rank in enumerate(ranks):
                path = timeline if r == 0 else "%s.rank%d%s" % (stem, r, ext)
                with open(path) as f:
                    rank["trace"] = json.load(f)["traceEvents"]
                if self.traces:
                    os.makedirs(self.traces, exist_ok=True)
                    with open(os.path.join(self.traces, "%s.rank%d.json" % (label, r)),
                              "w") as f:
                        json.dump({"traceEvents": rank["trace"], "window_us":
                                   rank["window_us"]}, f)
        return ranks


# -- reading timelines ------------------------------------------------------------------------
def _union(spans):
    merged = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def _length(spans):
    return sum(end - start for start, end in spans)


def _intersection(a, b):
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append([start, end])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def timeline_figures(ranks, iters):
    """hidden share (see the docstring); per iteration the time exchanges were in flight and
    the compute thread's copies of gradients, in ms; and the exposed time: the median over
    the measured iterations of wall time minus the compute thread's time in layers."""
    hidden = comm = copy = 0.0
    exposed = []
    for rank in ranks:
        lo, hi = rank["window_us"]

        def spans(test):
            return _union([(max(e["ts"], lo), min(e["ts"] + e["dur"], hi))
                           for e in rank["trace"] if e.get("ph") == "X" and test(e)
                           and e["ts"] < hi and e["ts"] + e["dur"] > lo])
        compute = spans(lambda e: e["cat"] == "compute" and e["tid"] == 0)
        exchanges = spans(lambda e: e["cat"] == "exchange")
        comm += _length(exchanges)
        hidden += _length(_intersection(compute, exchanges))
        copy += _length(spans(lambda e: e["cat"] == "sync"))
        # an iteration starts with the first layer's forward
        layers = sorted((e for e in rank["trace"] if e.get("ph") == "X"
                         and e["cat"] == "compute" and lo <= e["ts"] < hi),
                        key=lambda e: e["ts"])
        if layers:
            starts = [e["ts"] for e in layers if e["name"] == layers[0]["name"]] + [hi]
            gaps = [(b - a) - _length(_intersection(compute, [[a, b]]))
                    for a, b in zip(starts, starts[1:])]
            exposed.append(sorted(gaps)[len(gaps) // 2])
    n = len(ranks) * iters * 1e3
    return {"hidden_share": hidden / comm if comm else None, "comm_ms": comm / n,
            "copy_ms": copy / n,
            "exposed_ms": sum(exposed) / len(exposed) / 1e3 if exposed else None}


# -- measuring ----------------------------------------------------------------------------------
def summary(ranks):
    leaders = [r for r in ranks]       # one rank per host: every rank leads its host
    return {"seconds": max(r["seconds"] for r in ranks),
            "cpu_seconds": sum(r["cpu_seconds"] for r in ranks) / len(ranks),
            "stall": sum(r["stall"] for r in ranks) / len(ranks),
            # the communication thread's CPU per iteration (warm-up included), where it says
            "comm_cpu": (sum(r.get("comm_cpu_seconds") or 0 for r in ranks) / len(ranks)
                         / max(1, ranks[0].get("iterations") or 1)),
            "engine_bytes": sum(r.get("engine_bytes", 0) for r in leaders) / len(leaders),
            "wire": sum(r["wire"] for r in leaders) / len(leaders),
            "predicted": ranks[0].get("predicted"), "plan": ranks[0].get("plan"),
            "in_flight_peak": max((r.get("in_flight_peak") or 0) for r in ranks)}


def compute_alone(runner, net_text, hosts, iters, a):
    ranks = runner.run(net_text, hosts, "none", iters=iters, warmup=a.warmup, plan_for=hosts)
    return {"seconds": max(r["seconds"] for r in ranks),
            "exposed": sum(r["seconds"] - r["forward"] - r["backward"] for r in ranks)
            / len(ranks),
            "backward": max(r["backward"] for r in ranks),
            "forward": max(r["forward"] for r in ranks),
            "predicted_auto": ranks[0]["predicted_auto"]}


def auto_rate(predicted_bytes, backward_seconds):
    """The link rate (bits/s, rounded to 100 kbit) at which a host's planned bytes, half each
    way on a full-duplex link, take as long as the backward pass."""
    bits = 8.0 * (predicted_bytes / 2.0) / max(backward_seconds, 1e-3)
    return max(100000, int(round(bits / 1e5)) * 100000)


def _hidden_exposed(on, off, alone):
    base = alone["exposed"] * 1e3
    if on["exposed_ms"] is None or off["exposed_ms"] is None or off["exposed_ms"] <= base:
        return None
    return 1 - (on["exposed_ms"] - base) / (off["exposed_ms"] - base)


def _busy(figures, hosts):
    """The share of this machine's cores the ranks' processes kept busy (every rank here
    runs on this machine; the kernel's softirq work for the links is not in it)."""
    return figures["cpu_seconds"] * hosts / ((os.cpu_count() or 1) * figures["seconds"])


def measure_dwbp(runner, name, net_text, hosts, mode, a, iters, variants, rate, alone):
    """Per variant (label, tree, channels): the fastest of --repeat runs with DWBP on and off,
    interleaved with each other and with runs of the ranks computing alone."""
    best = {}
    for _ in range(a.repeat):
        again = compute_alone(runner, net_text, hosts, iters, a)
        if again["seconds"] < alone["seconds"]:
            alone = again
        for label, tree, channels in variants:
            for dwbp in (True, False):       # interleaved: the machine's load hits all alike
                ranks = runner.run(net_text, hosts, mode, dwbp, iters, a.warmup, channels,
                                   pythonpath=tree)
                figures = dict(summary(ranks), **timeline_figures(ranks, iters))
                key = (label, dwbp)
                if key not in best or figures["seconds"] < best[key]["seconds"]:
                    best[key] = figures
    rows = []
    for label, tree, channels in variants:
        on, off = best[(label, True)], best[(label, False)]
        comm_cost = off["seconds"] - alone["seconds"]
        rows.append({
            "net": name, "hosts": hosts, "mode": mode, "bandwidth": rate, "engine": label,
            "channels": channels, "iters": iters,
            "iter_ms_dwbp_on": on["seconds"] * 1e3, "iter_ms_dwbp_off": off["seconds"] * 1e3,
            "compute_ms": alone["seconds"] * 1e3, "backward_ms": alone["backward"] * 1e3,
            "hidden_share": on["hidden_share"], "hidden_share_off": off["hidden_share"],
            "hidden_share_iter": (1 - (on["seconds"] - alone["seconds"]) / comm_cost
                                  if comm_cost > 0 else None),
            "comm_ms_on": on["comm_ms"], "comm_ms_off": off["comm_ms"],
            "exposed_ms_on": on["exposed_ms"], "exposed_ms_off": off["exposed_ms"],
            "exposed_ms_alone": alone["exposed"] * 1e3,
            "hidden_share_exposed": _hidden_exposed(on, off, alone),
            "stall_ms_on": on["stall"] * 1e3, "stall_ms_off": off["stall"] * 1e3,
            "copy_ms_on": on["copy_ms"],
            "wire_bytes_per_iter": on["wire"] if runner.lab is not None else None,
            "engine_bytes_per_iter": on["engine_bytes"],
            "predicted_bytes_per_iter": on["predicted"],
            "in_flight_peak": on["in_flight_peak"],
            "cpu_ms_per_rank_on": on["cpu_seconds"] * 1e3,
            "cpu_ms_per_rank_off": off["cpu_seconds"] * 1e3,
            "comm_thread_cpu_ms_on": on["comm_cpu"] * 1e3,
            "machine_busy_on": _busy(on, hosts), "machine_busy_off": _busy(off, hosts),
            "plan": on["plan"],
        })
    return rows


def fmt(value, pattern):
    return "-" if value is None else pattern % value


def print_row(row):
    print("%-15s %d hosts %-10s %-9s %-7s on %8.1f ms  off %8.1f ms  alone %7.1f ms (bwd %7.1f)  "
          "hidden %s (iter %s, exposed %s, off %s)  stall on/off %s/%s ms  wire %s  engine %.0f  "
          "predicted %.0f B/iter  peak %s  CPU busy on/off %.2f/%.2f"
          % (row["net"], row["hosts"], row["bandwidth"] or "loopback", row["mode"],
             row["engine"], row["iter_ms_dwbp_on"], row["iter_ms_dwbp_off"], row["compute_ms"],
             row["backward_ms"], fmt(row["hidden_share"], "%.2f"),
             fmt(row["hidden_share_iter"], "%.2f"), fmt(row["hidden_share_exposed"], "%.2f"),
             fmt(row["hidden_share_off"], "%.2f"),
             fmt(row["stall_ms_on"], "%.1f"), fmt(row["stall_ms_off"], "%.1f"),
             fmt(row["wire_bytes_per_iter"], "%.0f"), row["engine_bytes_per_iter"],
             row["predicted_bytes_per_iter"], row["in_flight_peak"], row["machine_busy_on"],
             row["machine_busy_off"]))
    sys.stdout.flush()


def measure_sacp(runner, key, hosts, rate, a):
    """-sync=auto against every forced mode on one net, DWBP on: iterations per second."""
    name, net_text = net_at_batch(key, a.batches.get(key))
    rows = []
    best = {}
    modes = [m for m in a.sacp_modes.split(",") if m]
    for turn in range(a.repeat):
        # each repeat starts with another mode, so that none is always the first after the
        # lab comes up (or always beside the same burst of other jobs)
        for mode in modes[turn % len(modes):] + modes[:turn % len(modes)]:
            ranks = runner.run(net_text, hosts, mode, True, a.sacp_iters, a.warmup,
                               int(a.channels.split(",")[0]))
            figures = summary(ranks)
            if mode not in best or figures["seconds"] < best[mode]["seconds"]:
                best[mode] = figures
    for mode in modes:
        f = best[mode]
        row = {"net": name, "hosts": hosts, "bandwidth": rate, "mode": mode,
               "iter_per_s": 1.0 / f["seconds"], "iter_ms": f["seconds"] * 1e3,
               "wire_bytes_per_iter": f["wire"] if runner.lab is not None else None,
               "engine_bytes_per_iter": f["engine_bytes"],
               "predicted_bytes_per_iter": f["predicted"], "plan": f["plan"],
               "cpu_ms_per_rank": f["cpu_seconds"] * 1e3,
               "comm_thread_cpu_ms": f["comm_cpu"] * 1e3,
               # the forced modes whose plan is auto's own: their runs differ by noise alone
               "same_plan_as": [m for m in modes if m != mode and best[m]["plan"] == f["plan"]]}
        rows.append(row)
        print("SACP %s %d hosts %s %-9s %6.3f iter/s (%8.0f ms)  wire %s  predicted %.0f B/iter"
              "  CPU %.0f ms/rank%s"
              % (name, hosts, rate or "loopback", mode, row["iter_per_s"], row["iter_ms"],
                 fmt(row["wire_bytes_per_iter"], "%.0f"), row["predicted_bytes_per_iter"],
                 row["cpu_ms_per_rank"],
                 "  (plan = %s)" % ",".join(row["same_plan_as"]) if row["same_plan_as"] else ""))
        sys.stdout.flush()
    return rows


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nets", default="lenet,cifar,alexnet")
    parser.add_argument("--hosts", default="2,4", help="host counts over loopback")
    parser.add_argument("--netlab", default="", help="host counts across a shaped lab")
    parser.add_argument("--bandwidth", default="auto")
    parser.add_argument("--mtu", type=int, default=1500, help="the lab's frame size (9000: "
                        "jumbo frames, a sixth of the packets for the kernel to move)")
    parser.add_argument("--modes", default="auto")
    parser.add_argument("--batch", default="", help="images a worker per net, e.g. lenet=256 "
                        "(the nets' own batch otherwise)")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--channels", default="0", help="exchanges in flight, 0: one per "
                        "bucket (a list: one variant of the engine each)")
    parser.add_argument("--before", default="", help="also measure the engine of this tree "
                        "(another commit's files), with --before-channels exchanges in flight")
    parser.add_argument("--before-channels", type=int, default=1, help="exchanges in flight "
                        "for --before's engine (its own -comm_channels)")
    parser.add_argument("--alexnet-iters", type=int, default=5)
    parser.add_argument("--sacp", action="store_true", help="also compare -sync=auto with "
                        "every forced mode on --sacp-nets")
    parser.add_argument("--sacp-nets", default="alexnet,alexnet_cifar", help="nets for --sacp: "
                        "AlexNet b8 (auto's plan is sfb's) and AlexNet-CIFAR b64 (auto sends "
                        "fc8 through the servers, sfb as factors)")
    parser.add_argument("--sacp-modes", default="auto,ps,sfb,allreduce", help="the modes "
                        "--sacp compares (ps and allreduce move 20x the bytes on these nets)")
    parser.add_argument("--sacp-bandwidth", default="200mbit", help="link rates for --sacp "
                        "(a list)")
    parser.add_argument("--sacp-iters", type=int, default=3)
    parser.add_argument("--json", default="")
    parser.add_argument("--traces", default="", help="keep every run's timelines here")
    parser.add_argument("--pythonpath", default=ROOT, help="the tree whose poseidon_caffe runs "
                        "(another commit's engine, for a before/after)")
    a = parser.parse_args()
    a.batches = parse_batches(a.batch)
    known = ("auto", "ps", "sfb", "allreduce")
    for flag, listed in (("--modes", a.modes), ("--sacp-modes", a.sacp_modes)):
        wrong = [m for m in listed.split(",") if m not in known]
        if wrong:
            raise SystemExit("%s: %s is not one of %s" % (flag, ",".join(wrong), ",".join(known)))
    # a TERM ends the run through the finally blocks, which take the labs down
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    lab_hosts = [int(h) for h in a.netlab.split(",") if h]
    host_counts = lab_hosts or [int(h) for h in a.hosts.split(",") if h]
    report = {"machine": {"cores": os.cpu_count(), "load_before": load()},
              "netlab": bool(lab_hosts), "mtu": a.mtu if lab_hosts else None,
              "engine": a.pythonpath, "before": a.before,
              "rows": [], "sacp": []}
    sys.path.insert(0, ROOT)
    variants = [("after%s" % (c if int(c) else ""), a.pythonpath, int(c))
                for c in a.channels.split(",")]
    if a.before:
        variants.append(("before", os.path.abspath(a.before), a.before_channels))
    with tempfile.TemporaryDirectory() as tmp:
        loopback = Runner(tmp, a.pythonpath, traces=a.traces)
        for hosts in host_counts:
            for key in [n for n in a.nets.split(",") if n]:
                name, net_text = net_at_batch(key, a.batches.get(key))
                iters = a.alexnet_iters if key == "alexnet" else a.iters
                alone = compute_alone(loopback, net_text, hosts, iters, a)
                rate = None
                runner = loopback
                lab = None
                if lab_hosts:
                    from poseidon_caffe import netlab
                    bits = (auto_rate(alone["predicted_auto"], alone["backward"])
                            if a.bandwidth == "auto" else netlab.parse_rate(a.bandwidth))
                    rate = netlab.rate_text(bits)
                    lab = netlab.Lab.create(hosts, rate, mtu=a.mtu)
                    runner = Runner(tmp, a.pythonpath, lab, a.traces)
                try:
                    for mode in a.modes.split(","):
                        rows = measure_dwbp(runner, name, net_text, hosts, mode, a, iters,
                                            variants, rate, alone)
                        for row in rows:
                            report["rows"].append(row)
                            print_row(row)
                finally:
                    if lab is not None:
                        lab.destroy()
            for sacp_rate in (a.sacp_bandwidth.split(",") if a.sacp else []):
                runner, lab, rate = loopback, None, None
                if lab_hosts:
                    from poseidon_caffe import netlab
                    rate = sacp_rate
                    lab = netlab.Lab.create(hosts, rate, mtu=a.mtu)
                    runner = Runner(tmp, a.pythonpath, lab, a.traces)
                try:
                    for key in [n for n in a.sacp_nets.split(",") if n]:
                        report["sacp"] += measure_sacp(runner, key, hosts, rate, a)
                finally:
                    if lab is not None:
                        lab.destroy()
                if not lab_hosts:
                    break
    report["machine"]["load_after"] = load()
    print("machine: %d cores, load average %s before, %s after"
          % (os.cpu_count(), report["machine"]["load_before"], report["machine"]["load_after"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
