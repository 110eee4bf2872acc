"""``mpiexec -n H poseidon-caffe calibrate -model NET``: the figures ``simulate`` needs about
the machines a job will run on, measured there (``simulator/calibration.py``): the rate and
latency MPI gets between the nodes, and what communication costs the compute on a node's
cores. One rank per node; rank 0 prints them as ``simulate`` flags."""
import json
import logging
import math
import sys

from .. import log
from . import flags as flagmod

CALIBRATE_FLAGS = [
    flagmod.Flag("model", "", "The net whose forward and backward is the unit of compute (its "
                 "TRAIN phase, dataset layers as inputs, as simulate builds it)"),
    flagmod.Flag("batch", 0, "Images per worker (default: the net's own batch)"),
    flagmod.Flag("data_shape", "", "C,H,W of the images a Data layer would produce (default: "
                 "3,crop_size,crop_size)"),
    flagmod.Flag("seconds", 1.5, "Length of each timed phase (there are six)"),
    flagmod.Flag("json", "", "Also write every rank's figures and the combined ones here"),
]

CALIBRATE_USAGE = """Measure the simulator's link and host-CPU figures on the nodes of a job.
Usage (one rank per node, the nodes the job will use):
    mpiexec -n H -hosts A,B,... poseidon-caffe calibrate -model NET [-batch N]
            [-data_shape C,H,W] [-seconds 1.5] [-json FILE]
Rank 0 prints the figures as the flags of `poseidon-caffe simulate` (-bandwidth, with
-wire_efficiency 1 since MPI's rate is payload already, -latency, -cores_per_node 1,
-cpu_polling, -cpu_per_round, -cpu_per_byte): the link's rate each way is the slowest
rank's, the latency the median pair's, the CPU costs the ranks' mean.
-cores_per_node 1 is the model's reading of them: the compute fills its node's share of the
cores and communication takes from it (docs/SIMULATION.md, the host's cores).
"""


def _one_pass(values):
    """The unit of compute: one forward and backward of the net, its inputs filled once."""
    from ..simulator.compute import fill_inputs
    from ..simulator.model import build_net, parse_data_shape
    data_shape = parse_data_shape(values["data_shape"]) if values["data_shape"] else None
    net, _ = build_net(values["model"], data_shape, allocate=True,
                       batch=values["batch"] or None)
    fill_inputs(net)

    def one_pass():
        net.forward_prefilled()
        net.backward_from_to()
    return one_pass


def combined(ranks):
    """The figures of every rank as simulate's: the slowest link, the median latency, the
    mean CPU costs."""
    from ..simulator import calibration
    latencies = sorted(r["latency_s"] for r in ranks)
    out = {"bandwidth_bytes_per_s": min(r["rate_bytes_per_s"] for r in ranks),
           "latency_s": latencies[len(latencies) // 2]}
    out.update(calibration.combine([r["host_cpu"] for r in ranks]))
    return out


def simulate_flags(figures):
    """The command-line flags of ``simulate`` that say ``figures`` (``combined``'s)."""
    # plain decimals: the rate grammar reads no exponents. The rate is MPI's payload, so
    # no share of it goes to headers (-wire_efficiency 1)
    return ("-bandwidth %.1fmbit -wire_efficiency 1 -latency %.4fms -cores_per_node 1 "
            "-cpu_polling %.3f -cpu_per_round %.4fms -cpu_per_byte %.3g"
            % (figures["bandwidth_bytes_per_s"] * 8 / 1e6, figures["latency_s"] * 1e3,
               figures["cpu_polling"], figures["cpu_per_round"] * 1e3,
               figures["cpu_per_byte"]))


def _measure(comm, one_pass, seconds):
    from ..simulator import calibration
    rate, latency = calibration.link(comm)
    host_cpu = calibration.measure(comm, one_pass, seconds=seconds)
    return {"rank": comm.rank, "rate_bytes_per_s": rate, "latency_s": latency,
            "host_cpu": host_cpu}


@flagmod.documented(CALIBRATE_USAGE, CALIBRATE_FLAGS)
def calibrate_main(argv):
    if any(a in ("-h", "-help", "--help") for a in argv):
        sys.stdout.write("%s\nFlags:\n%s\n" % (CALIBRATE_USAGE, flagmod.usage(CALIBRATE_FLAGS)))
        return 0
    try:
        values, args = flagmod.parse(argv, CALIBRATE_FLAGS)
        if args:
            raise flagmod.FlagError("calibrate takes only flags; unexpected argument(s): %s"
                                    % " ".join(args))
        if not values["model"]:
            raise flagmod.FlagError("calibrate needs a net: -model=NET.prototxt")
        if not (values["seconds"] > 0 and math.isfinite(values["seconds"])):
            raise flagmod.FlagError("-seconds=%g: each timed phase lasts more than 0 s"
                                    % values["seconds"])
        if values["batch"] < 0:
            raise flagmod.FlagError("-batch=%d: a worker's batch is at least 1"
                                    % values["batch"])
        # the net's set-up lines are not the answer: only warnings and errors reach the console
        log.set_console_level(logging.WARNING)
        try:
            one_pass = _one_pass(values)
            from mpi4py import MPI
            comm = MPI.COMM_WORLD
            if comm.size < 2:
                raise flagmod.FlagError(
                    "calibrate measures the messages between nodes: run it under mpiexec "
                    "with one rank per node, 2 or more (mpiexec -n 2 -hosts A,B "
                    "poseidon-caffe calibrate -model NET); this is 1 rank")
            mine = _measure(comm, one_pass, values["seconds"])
        finally:
            log.set_console_level(logging.NOTSET)
        ranks = comm.gather(mine, root=0)
        if comm.rank == 0:
            figures = combined(ranks)
            sys.stdout.write(
                "calibrate: %d nodes; link %.1f Mbit/s each way (slowest rank), latency %.3f ms; "
                "communication's CPU: polling %.3f of a core, %.3f ms a round, %.3g s a byte\n"
                "simulate flags: %s\n"
                % (comm.size, figures["bandwidth_bytes_per_s"] * 8 / 1e6,
                   figures["latency_s"] * 1e3, figures["cpu_polling"],
                   figures["cpu_per_round"] * 1e3, figures["cpu_per_byte"],
                   simulate_flags(figures)))
            if values["json"]:
                with open(values["json"], "w") as f:
                    json.dump({"model": values["model"], "nodes": comm.size,
                               "combined": figures, "simulate_flags": simulate_flags(figures),
                               "ranks": ranks}, f, indent=1)
    except (ValueError, OSError, RuntimeError) as exc:
        log.error("calibrate: %s", exc)
        return 1
    except MemoryError as exc:
        log.error("calibrate: out of memory: %s", str(exc) or "an allocation failed")
        return 1
    return 0
