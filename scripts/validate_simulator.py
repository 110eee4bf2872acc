"""The simulator against the real engine: measured vs predicted iteration time on shaped
networks (netlab: one network namespace per host, tc-shaped links; root needed).

For each host count, bandwidth, sync mode and DWBP on/off, one job runs across a fresh lab:
every rank first times its net layer by layer (the timing `time` does, all ranks at once, so
the cores are shared as in training), then trains; rank 0 reports the per-layer times and the
seconds per iteration. The simulator is given those per-layer times, the lab's rate and the
same mode, and its prediction is printed beside the measurement.

    python scripts/validate_simulator.py [--hosts 2,4] [--bandwidths 100mbit,300mbit]
        [--modes ps,sfb,allreduce,auto] [--iters 8] [--json out.json]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

WORKER = r'''
import json, sys, time, types
import poseidon_caffe  # first: it gives each rank its share of the cores before numpy loads
import numpy as np
from mpi4py import MPI
from google.protobuf import text_format
from poseidon_caffe import sync
from poseidon_caffe.net.timing import time_layers
from poseidon_caffe.proto import caffe_pb2
from poseidon_caffe.solver import get_solver
net_text, iters, mode, dwbp, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1", sys.argv[5]
comm = MPI.COMM_WORLD
sp = caffe_pb2.SolverParameter()
text_format.Merge('base_lr: 0.001 momentum: 0.9 lr_policy: "fixed" display: 0 random_seed: 1 max_iter: 100000', sp)
text_format.Merge(open(net_text).read(), sp.net_param)
solver = get_solver(sp)
net = solver.net
rng = np.random.default_rng(comm.rank)
data, label = net.blobs["data"], net.blobs["label"]
data.data[...] = rng.standard_normal(data.shape)
label.data[...] = rng.integers(0, 10, label.shape)
net.forward_prefilled(); net.backward_from_to()
comm.Barrier()
timed = time_layers(net, 5)
layers = [(name, f / 5 * 1e3, b / 5 * 1e3) for name, f, b in
          zip(net.layer_names, timed["forward"], timed["backward"])]
from poseidon_caffe.simulator.compute import measure_update_rate
update_rate = measure_update_rate(sum(p.count for p in net.learnable_params))
# what MPI moves on this link, each way, while every host sends to the next and hears the
# last, and how long a small message takes one way, waited for as the engine waits: the
# latency a round of the exchange pays on this machine now (simulator/calibration.py)
from poseidon_caffe.simulator import calibration
link_rate, one_way = calibration.link(comm)
# what communication costs the compute on these cores: the net's forward and backward alone,
# then beside rounds of small and of large messages
def one_pass():
    net.forward_prefilled(); net.backward_from_to()
host_cpu = calibration.measure(comm, one_pass)
runner = sync.attach(solver, types.SimpleNamespace(sync=mode, dwbp=dwbp, ranks_per_host=1))
solver.step(3)
runner.engine.sync_point()
# the same layers' times again while training: the cores are then shared with the exchanges
during = {"forward": [0.0] * len(net.layers), "backward": [0.0] * len(net.layers)}
def clock_layer(kind, i, start, end):
    during[kind][i] += end - start
net.set_layer_timing_hook(clock_layer)
comm.Barrier()
t0 = time.perf_counter()
solver.step(iters)
runner.engine.sync_point()
seconds = (time.perf_counter() - t0) / iters
net.set_layer_timing_hook(None)
layers_training = [(name, f / iters * 1e3, b / iters * 1e3) for name, f, b in
                   zip(net.layer_names, during["forward"], during["backward"])]
runner.finish()
st = runner.engine.stats()
result = {"seconds": seconds, "layers": layers, "layers_training": layers_training,
          "update_rate": update_rate,
          "link_rate": link_rate, "one_way_latency": one_way, "host_cpu": host_cpu,
          "plan": st["plan"],
          "bytes": sum(r["sent"] + r["received"] for r in st["measured"].values()),
          "comm_seconds": st["comm_seconds"] / max(st["iterations"], 1),
          "comm_cpu_seconds": st["comm_cpu_seconds"] / max(st["iterations"], 1),
          "wait_seconds": st["wait_seconds"] / max(st["iterations"], 1),
          "predicted_bytes": sum(st["predicted"].values())}
everything = comm.gather(result, root=0)
if comm.rank == 0:
    json.dump(everything, open(out, "w"))
'''

# a small net with a large fully connected layer: compute in the convolutions, bytes in fc1
NET = """name: "validation"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 16 dim: 3 dim: 32 dim: 32 } } }
layer { name: "label" type: "Input" top: "label" input_param { shape { dim: 16 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 32 pad: 2 kernel_size: 5 weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2" convolution_param { num_output: 64 pad: 2 kernel_size: 5 weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "fc1" type: "InnerProduct" bottom: "pool2" top: "fc1" inner_product_param { num_output: 512 weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "relu3" type: "ReLU" bottom: "fc1" top: "fc1" }
layer { name: "fc2" type: "InnerProduct" bottom: "fc1" top: "fc2" inner_product_param { num_output: 256 weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "relu4" type: "ReLU" bottom: "fc2" top: "fc2" }
layer { name: "fc3" type: "InnerProduct" bottom: "fc2" top: "fc3" inner_product_param { num_output: 10 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc3" bottom: "label" top: "loss" }
"""

THREADS = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


def measure(hosts, bandwidth, mode, dwbp, iters, tmp, net_text=NET):
    """Rank 0's result of one job across a fresh lab of ``hosts`` hosts at ``bandwidth``."""
    from poseidon_caffe import netlab
    worker = os.path.join(tmp, "worker.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    net_path = os.path.join(tmp, "net.prototxt")
    with open(net_path, "w") as f:
        f.write(net_text)
    out = os.path.join(tmp, "out.json")
    if os.path.exists(out):
        os.remove(out)
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    argv = [mpiexec, "-hosts", "HOSTS", "-n", str(hosts), sys.executable, worker,
            net_path, str(iters), mode, "1" if dwbp else "0", out]

    def name_hosts(lab):           # one rank on each of the lab's hosts
        argv[2] = ",".join("%s:1" % address for address in lab.addresses)
    env = dict(os.environ, PYTHONPATH=ROOT, POSEIDON_NO_PROGRESS="1", **THREADS)
    result = netlab.run_across(hosts, bandwidth, argv, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=600, on_ready=name_hosts)
    if result.returncode or not os.path.exists(out):
        err = (result.stderr or b"").decode("utf-8", "replace")
        raise SystemExit("job failed (%d hosts, %s, %s, dwbp %s): %s"
                         % (hosts, bandwidth, mode, dwbp, err[-3000:]))
    with open(out) as f:
        ranks = json.load(f)
    wire = sum(h.tx_bytes + h.rx_bytes for h in result.wire) / float(hosts)
    return ranks, wire


# the lab's hosts share this machine's cores; what one host's compute thread gets alone is
# what its layer times show, and the calibration measures the communication's costs in the
# compute they displace: one core, in the model's terms, per host
LAB_CORES_PER_NODE = 1.0
MIB = float(1 << 20)      # byte sizes are binary and named so, as the simulator's report


def predict(ranks, hosts, bandwidth, mode, dwbp, net_text=NET, calibrated=False,
            during_training=False, host_cpu=False):
    """The simulator's Prediction for the job whose ranks reported ``ranks``: its per-layer
    times (timed alone before training, or ``during_training``) and update rate (means over
    the ranks), and the lab's rate less the headers, or (``calibrated``) the rate MPI moved
    on the lab's links before training; ``host_cpu``: calibrated, and the host's cores
    shared with the CPU costs of communication the ranks measured before training."""
    from poseidon_caffe import simulator
    from poseidon_caffe.simulator import model as net_models
    from poseidon_caffe.simulator.compute import LayerTimes
    from poseidon_caffe.io import parse_net_text
    model, _ = net_models.load(parse_net_text(net_text, "validation net"))
    key = "layers_training" if during_training else "layers"
    by_name = {name: [] for name in model.layer_names}
    for rank in ranks:
        for name, f, b in rank[key]:
            by_name[name].append((f, b))
    # every worker waits for the slowest one at each exchange: the mean rank is the typical one
    forward = [sum(f for f, _ in by_name[n]) / len(by_name[n]) for n in model.layer_names]
    backward = [sum(b for _, b in by_name[n]) / len(by_name[n]) for n in model.layer_names]
    times = LayerTimes(forward, backward)
    update_rate = sum(r["update_rate"] for r in ranks) / len(ranks)
    if calibrated or host_cpu:
        rate = min(r["link_rate"] for r in ranks)
        latency = max(r["one_way_latency"] for r in ranks)
        costs = {"cpu_per_byte": 0.0, "cpu_per_round": 0.0}
        if host_cpu:
            from poseidon_caffe.simulator import calibration
            costs = calibration.combine([r["host_cpu"] for r in ranks])
            costs["cores"] = LAB_CORES_PER_NODE
        cluster = simulator.Cluster(hosts, rate, latency=latency, update_rate=update_rate,
                                    wire_efficiency=1.0, **costs)
    else:
        cluster = simulator.Cluster(hosts, simulator.parse_rate(bandwidth),
                                    update_rate=update_rate)
    return simulator.simulate(model, times, cluster, mode=mode, dwbp=dwbp)


HEADER = ("%5s %9s %-9s %5s %9s %9s %7s %9s %7s %10s %7s %9s %7s %8s %8s" % (
    "hosts", "bandwidth", "mode", "dwbp", "measured", "predicted", "error", "in-train",
    "error", "calibrated", "error", "host-cpu", "error", "compute", "MiB/host"))


def compare(hosts, bandwidth, mode, dwbp, ranks):
    """The row of one job: measured against each prediction; printed."""
    from poseidon_caffe.simulator import calibration
    measured = max(r["seconds"] for r in ranks)
    p = predict(ranks, hosts, bandwidth, mode, dwbp)
    c = predict(ranks, hosts, bandwidth, mode, dwbp, calibrated=True)
    t = predict(ranks, hosts, bandwidth, mode, dwbp, during_training=True)
    h = predict(ranks, hosts, bandwidth, mode, dwbp, host_cpu=True)
    costs = calibration.combine([r["host_cpu"] for r in ranks])
    error = p.iter_s / measured - 1
    error_c = c.iter_s / measured - 1
    error_t = t.iter_s / measured - 1
    error_h = h.iter_s / measured - 1
    row = {"hosts": hosts, "bandwidth": bandwidth, "mode": mode,
           "dwbp": dwbp, "measured_ms": measured * 1e3,
           "predicted_ms": p.iter_s * 1e3, "error": error,
           "calibrated_ms": c.iter_s * 1e3, "calibrated_error": error_c,
           "in_training_ms": t.iter_s * 1e3, "in_training_error": error_t,
           "host_cpu_ms": h.iter_s * 1e3, "host_cpu_error": error_h,
           "host_cpu_compute_ms": h.compute_busy_s * 1e3,
           "host_cpu_comm_ms": h.comm_s * 1e3,
           "cpu_polling": costs["cpu_polling"],
           "cpu_per_round_ms": costs["cpu_per_round"] * 1e3,
           "cpu_per_byte_ns": costs["cpu_per_byte"] * 1e9,
           "compute_in_training_ms": t.compute_s * 1e3,
           "mpi_link_mb_s": min(r["link_rate"] for r in ranks) / 1e6,
           "one_way_latency_ms": 1e3 * max(r["one_way_latency"] for r in ranks),
           "compute_ms": p.compute_s * 1e3,
           "planner_mib_per_host": p.host_bytes / MIB,
           "engine_mib_per_host": ranks[0]["bytes"] / MIB,
           "engine_comm_ms": 1e3 * max(r["comm_seconds"] for r in ranks),
           "engine_comm_cpu_ms": 1e3 * max(r["comm_cpu_seconds"] for r in ranks),
           "engine_wait_ms": 1e3 * max(r["wait_seconds"] for r in ranks),
           "predicted_comm_ms": p.comm_s * 1e3,
           "calibrated_comm_ms": c.comm_s * 1e3,
           "ranks": ranks}
    print("%5d %9s %-9s %5s %9.1f %9.1f %+6.1f%% %9.1f %+6.1f%% %10.1f "
          "%+6.1f%% %9.1f %+6.1f%% %8.1f %8.2f"
          % (hosts, bandwidth, mode, "on" if dwbp else "off",
             measured * 1e3, p.iter_s * 1e3, 100 * error, t.iter_s * 1e3,
             100 * error_t, c.iter_s * 1e3, 100 * error_c, h.iter_s * 1e3,
             100 * error_h, p.compute_s * 1e3, p.host_bytes / MIB))
    print("      host CPU measured: polling %.3f of a core, %.3f ms a round, %.2f ns a byte "
          "(compute alone drifted %s); predicted compute %.1f ms, in training %.1f ms"
          % (costs["cpu_polling"], costs["cpu_per_round"] * 1e3, costs["cpu_per_byte"] * 1e9,
             "/".join("%+.0f%%" % (100 * r["host_cpu"]["alone_drift"]) for r in ranks),
             h.compute_busy_s * 1e3, t.compute_s * 1e3))
    sys.stdout.flush()
    return row


def summary(rows):
    for key, what in (("error", "compute timed alone"),
                      ("in_training_error", "compute timed in training"),
                      ("calibrated_error", "compute alone, measured link rate and latency"),
                      ("host_cpu_error", "calibrated, and the host's cores shared with "
                                         "communication's measured CPU costs")):
        worst = max(abs(r[key]) for r in rows)
        within = sum(abs(r[key]) <= 0.15 for r in rows)
        print("%s: worst error %.1f%%, %d of %d configurations within 15%%"
              % (what, 100 * worst, within, len(rows)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="2,4")
    parser.add_argument("--bandwidths", default="100mbit,300mbit")
    parser.add_argument("--modes", default="ps,sfb,allreduce,auto")
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--json", default="", help="write the rows (with every rank's "
                        "report) here, after each job")
    parser.add_argument("--predict-again", default="", metavar="JSON",
                        help="run nothing: the predictions again for the jobs a --json file "
                        "holds")
    a = parser.parse_args()
    rows = []
    print(HEADER)
    if a.predict_again:
        with open(a.predict_again) as f:
            for old in json.load(f):
                rows.append(compare(old["hosts"], old["bandwidth"], old["mode"], old["dwbp"],
                                    old["ranks"]))
        summary(rows)
        return
    print("load average at the start: %.2f %.2f %.2f" % os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        for hosts in [int(h) for h in a.hosts.split(",")]:
            for bandwidth in a.bandwidths.split(","):
                for mode in a.modes.split(","):
                    for dwbp in (True, False):
                        ranks, wire = measure(hosts, bandwidth, mode, dwbp, a.iters, tmp)
                        row = compare(hosts, bandwidth, mode, dwbp, ranks)
                        row["load_average"] = os.getloadavg()[0]
                        row["wire_mib_per_host"] = wire / MIB
                        rows.append(row)
                        if a.json:
                            with open(a.json, "w") as f:
                                json.dump(rows, f, indent=1)
    print("load average at the end: %.2f %.2f %.2f" % os.getloadavg())
    summary(rows)


if __name__ == "__main__":
    main()
