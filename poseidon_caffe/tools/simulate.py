"""``poseidon-caffe simulate -model NET -nodes 1,2,4,8 -bandwidth 10gbit ...``: predicted
iteration time, throughput and speedup of distributed training on clusters of any size
(``simulator/``)."""
import contextlib
import logging
import sys

from .. import log
from . import flags as flagmod

SIMULATE_FLAGS = [
    flagmod.Flag("model", "", "The net prototxt (its TRAIN phase is simulated)"),
    flagmod.Flag("nodes", "1,2,4,8,16,32", "Node counts to predict, comma-separated"),
    flagmod.Flag("gpus_per_node", 1, "Workers (devices) per node"),
    flagmod.Flag("bandwidth", "10gbit", "Each node's NIC rate, each way (tc's units: 10gbit, "
                 "100mbit, 40gbit)"),
    flagmod.Flag("latency", "0", "One-way latency between nodes (50us, 0.2ms)"),
    flagmod.Flag("local_bandwidth", "100gbit", "Rate between the devices of one node"),
    flagmod.Flag("compute", "measured", "Per-layer times: 'measured' (timed here as `time` "
                 "does), a file (CSV layer,forward_ms,backward_ms; JSON; a `time` log; or the "
                 "report of scripts/bench_gpu.py --json), or "
                 "total=MS (one iteration's time spread over the layers by multiply-adds)"),
    flagmod.Flag("iterations", 5, "Timed passes for -compute measured"),
    flagmod.Flag("sync", "auto", "Strategy: auto (the planner's choice per blob), ps, sfb or "
                 "allreduce"),
    flagmod.Flag("svb", None, "Poseidon's switch, as for train: true sends every "
                 "InnerProduct weight as sufficient factors, false none", kind=bool),
    flagmod.Flag("dwbp", True, "Wait-free backprop: each layer's exchange starts when its "
                 "backward ends (false: all after backward)"),
    flagmod.Flag("comm_channels", 0, "Exchanges in flight at once, as train's -comm_channels "
                 "(bucket b on channel b mod N, 0: one per bucket; exchanges on the wire "
                 "share the NIC)"),
    flagmod.Flag("overhead", "0", "Fixed software cost of each exchange (e.g. 0.2ms)"),
    flagmod.Flag("update_rate", 0.0, "Parameter values per second the update after an "
                 "exchange runs at (0: measured here with -compute measured, else not counted)"),
    flagmod.Flag("wire_efficiency", 0.94, "Share of the link's bytes that are payload "
                 "(Ethernet, IP, TCP headers take the rest)"),
    flagmod.Flag("cores_per_node", None, "Cores a node's threads share (compute, communication, "
                 "the worker thread, the network stack); not given: a core for each, and "
                 "communication costs no compute (docs/SIMULATION.md, the host's cores)",
                 kind=float),
    flagmod.Flag("cpu_per_byte", 0.0, "CPU seconds the software and the kernel spend per "
                 "off-host byte sent or received (e.g. 2e-9; measured by "
                 "simulator/calibration.py)"),
    flagmod.Flag("cpu_polling", 0.0, "Share of a core the communication thread takes while "
                 "exchanges are in flight (testing and sleeping; e.g. 0.05)"),
    flagmod.Flag("cpu_per_round", "0", "CPU time of each round of messages of an exchange "
                 "(e.g. 0.3ms; ps has 2 rounds, sfb 1, the ring 2(N-1))"),
    flagmod.Flag("fuse_bytes", 1 << 16, "Small blobs are fused up to this many bytes, as "
                 "train's -fuse_bytes"),
    flagmod.Flag("data_shape", "", "C,H,W of the images a Data layer would produce (default: "
                 "3,crop_size,crop_size)"),
    flagmod.Flag("batch", 0, "Images per GPU and iteration (default: the net's own batch)"),
    flagmod.Flag("plot", "", "Also draw speedup against nodes into this PNG (or .svg, .pdf)"),
    flagmod.Flag("json", "", "Also write the rows to this JSON file"),
]

SIMULATE_USAGE = """Predict iteration time, images/s and speedup of distributed training.
Usage:
    simulate -model NET [-nodes 1,2,4,8,16,32] [-gpus_per_node N] [-bandwidth 10gbit]
             [-latency 50us] [-compute measured|FILE|total=MS] [-sync auto|ps|sfb|allreduce]
             [-dwbp true|false] [-cores_per_node C -cpu_polling F -cpu_per_round T
             -cpu_per_byte S]
             [-plot FILE.png] [-json FILE.json]
One row per node count. speedup is images/s over one node with the same GPUs per node (as
Poseidon reports it); comm_ms is the time a node's exchanges take per iteration and hidden the
share of it that overlapped compute. See docs/SIMULATION.md.
"""


def _nodes(text):
    try:
        nodes = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        nodes = []
    if not nodes or min(nodes) < 1:
        raise flagmod.FlagError("-nodes=%r is not a list of node counts >= 1 (e.g. 1,2,4,8)"
                                % (text,))
    return sorted(set(nodes))


@contextlib.contextmanager
def _quiet():
    """The nets' set-up lines are not the answer: only warnings and errors reach the console
    while a net is built."""
    log.set_console_level(logging.WARNING)
    try:
        yield
    finally:
        log.set_console_level(logging.NOTSET)


def _measure(values, model, net_path, data_shape):
    """Times the TRAIN net on this CPU, saying so first and drawing progress on a terminal:
    a large net at its full batch takes minutes."""
    from .. import simulator
    from ..progress import ProgressBar
    from ..simulator.model import build_net
    iterations = values["iterations"]
    if iterations < 1:
        raise flagmod.FlagError("-iterations=%d: time at least one pass" % iterations)
    with _quiet():
        net, _ = build_net(net_path, data_shape, allocate=True, batch=values["batch"] or None)
    log.info("simulate: timing the %d layers of %s at batch %d on this CPU, 1 untimed pass "
             "and %d timed (-compute=FILE or -compute=total=MS takes the times from elsewhere)",
             len(net.layers), net_path, model.batch, iterations)
    steps = 2 * len(net.layers) * (1 + iterations)
    with ProgressBar(steps, "Timing on this CPU") as bar:
        return simulator.measure(net, iterations, warmup=1,
                                 on_step=lambda done, total: bar.update(done, "layer steps"))


def _times(values, model, net_path, data_shape):
    from .. import simulator
    spec = values["compute"]
    if spec == "measured":
        return _measure(values, model, net_path, data_shape)
    if spec.startswith("total="):
        from ..simulator.model import build_net
        try:
            total = float(spec[len("total="):])
        except ValueError:
            total = -1.0
        if not total > 0:
            raise flagmod.FlagError("-compute=%s: total= takes one iteration's milliseconds "
                                    "(> 0)" % spec)
        with _quiet():
            net, _ = build_net(net_path, data_shape, batch=values["batch"] or None)
        return simulator.spread_total(net, total, net_path)
    return simulator.read_compute_file(spec, model)


def simulate_rows(values):
    """(rows, inputs) for the parsed flags: the command's work without printing."""
    from .. import simulator
    from ..simulator import model as net_models
    from ..simulator import report
    if not values["model"]:
        raise flagmod.FlagError("simulate needs a net: -model=NET.prototxt")
    nodes = _nodes(values["nodes"])
    if values["gpus_per_node"] < 1:
        raise flagmod.FlagError("-gpus_per_node=%d: a node has at least one GPU"
                                % values["gpus_per_node"])
    bandwidth = simulator.parse_rate(values["bandwidth"], "-bandwidth")
    local = simulator.parse_rate(values["local_bandwidth"], "-local_bandwidth")
    latency = simulator.parse_delay(values["latency"], "-latency")
    overhead = simulator.parse_delay(values["overhead"], "-overhead")
    cpu_per_round = simulator.parse_delay(values["cpu_per_round"], "-cpu_per_round")
    cores = values["cores_per_node"]
    if cores is not None and not cores >= 1:
        raise flagmod.FlagError("-cores_per_node=%g: the cores a node's threads share, 1 or "
                                "more" % cores)
    if not 0 <= values["cpu_polling"] <= 1:
        raise flagmod.FlagError("-cpu_polling=%g: a share of a core, 0 to 1"
                                % values["cpu_polling"])
    if not values["cpu_per_byte"] >= 0:
        raise flagmod.FlagError("-cpu_per_byte=%g: CPU seconds per byte, 0 or more"
                                % values["cpu_per_byte"])
    data_shape = net_models.parse_data_shape(values["data_shape"]) if values["data_shape"] \
        else None
    with _quiet():
        model, _ = simulator.load(values["model"], data_shape, values["batch"] or None)
    times = _times(values, model, values["model"], data_shape)
    update_rate = values["update_rate"]
    if update_rate < 0:
        raise flagmod.FlagError("-update_rate=%g: values per second, 0 or more" % update_rate)
    if not update_rate and values["compute"] == "measured":
        from ..simulator.compute import measure_update_rate
        update_rate = measure_update_rate()
    cluster = simulator.Cluster(1, bandwidth, values["gpus_per_node"], latency, local,
                                values["comm_channels"], overhead, update_rate,
                                values["wire_efficiency"], cores, values["cpu_per_byte"],
                                cpu_per_round, values["cpu_polling"])
    predictions, baseline = simulator.predict(model, times, nodes, cluster, values["sync"],
                                              values["svb"], values["dwbp"],
                                              values["fuse_bytes"])
    inputs = {"net": model.name, "model": values["model"], "batch_per_gpu": model.batch,
              "gpus_per_node": values["gpus_per_node"], "bandwidth": values["bandwidth"],
              "latency": values["latency"], "local_bandwidth": values["local_bandwidth"],
              "compute": values["compute"], "compute_ms_per_iteration": times.total_ms,
              "compute_source": times.source,
              "sync": values["sync"], "svb": values["svb"], "dwbp": values["dwbp"],
              "comm_channels": values["comm_channels"], "overhead": values["overhead"],
              "update_rate": update_rate, "wire_efficiency": values["wire_efficiency"],
              "cores_per_node": cores, "cpu_per_byte": values["cpu_per_byte"],
              "cpu_per_round": values["cpu_per_round"], "cpu_polling": values["cpu_polling"],
              "speedup_over": "one node of %d worker(s)" % values["gpus_per_node"]}
    if times.note:
        inputs["compute_note"] = times.note
    return report.rows(predictions, baseline), inputs


@flagmod.documented(SIMULATE_USAGE, SIMULATE_FLAGS)
def simulate_main(argv):
    from ..simulator import report
    if any(a in ("-h", "-help", "--help") for a in argv):
        sys.stdout.write("%s\nFlags:\n%s\n" % (SIMULATE_USAGE, flagmod.usage(SIMULATE_FLAGS)))
        return 0
    try:
        values, args = flagmod.parse(argv, SIMULATE_FLAGS)
        if args:
            raise flagmod.FlagError("simulate takes only flags; unexpected argument(s): %s"
                                    % " ".join(args))
        rows, inputs = simulate_rows(values)
        # a worker is what the compute times were taken on: this CPU, a GPU, or a guess
        sys.stdout.write("%s: batch %d per worker, %d worker(s) per node, %s each way, latency "
                         "%s, -sync=%s, dwbp %s; speedup over %s\n"
                         % (inputs["net"] or inputs["model"], inputs["batch_per_gpu"],
                            inputs["gpus_per_node"], inputs["bandwidth"], inputs["latency"],
                            inputs["sync"], "on" if inputs["dwbp"] else "off",
                            inputs["speedup_over"]))
        sys.stdout.write("compute: %.1f ms per worker and iteration, %s\n"
                         % (inputs["compute_ms_per_iteration"], inputs["compute_source"]))
        if "compute_note" in inputs:
            sys.stdout.write("note: %s\n" % inputs["compute_note"])
        sys.stdout.write(report.table(rows) + "\n")
        if values["json"]:
            report.write_json(rows, values["json"], inputs)
        if values["plot"]:
            report.plot_speedups({inputs["net"] or "net": rows}, values["plot"],
                                 "%s, %s" % (inputs["net"] or inputs["model"],
                                             inputs["bandwidth"]))
    except (ValueError, OSError, RuntimeError) as exc:
        log.error("simulate: %s", exc)
        return 1
    except MemoryError as exc:
        log.error("simulate: out of memory: %s", str(exc) or "an allocation failed")
        return 1
    return 0
