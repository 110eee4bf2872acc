"""Predicted iteration time, throughput and speedup of a net on clusters this machine cannot
hold: per-layer compute times, the planner's bytes per blob, a link model and the wait-free
backprop schedule (``schedule.py``). It runs no job: it reads the net's shapes and asks the
sync planner what each blob would cost.

    model, net = simulator.model.load("net.prototxt")
    times = simulator.compute.read_compute_file("times.csv", model)   # or measure(net)
    cluster = simulator.schedule.Cluster(hosts=8, bandwidth=parse_rate("40gbit"))
    prediction = simulator.schedule.simulate(model, times, cluster)
"""
from .compute import LayerTimes, measure, read_compute_file, spread_total  # noqa: F401
from .model import NetModel, SimulationError, load  # noqa: F401
from .rates import RateError, parse_delay, parse_rate  # noqa: F401
from .schedule import Cluster, Prediction, simulate  # noqa: F401


def predict(model, times, nodes, cluster, mode="auto", svb=None, dwbp=True,
            fuse_bytes=1 << 16):
    """(predictions for each node count, the one-node baseline): ``cluster`` gives everything
    but the node count."""
    baseline = simulate(model, times, cluster.with_hosts(1), mode, svb, dwbp, fuse_bytes)
    out = []
    for hosts in nodes:
        if hosts == 1:
            out.append(baseline)
        else:
            out.append(simulate(model, times, cluster.with_hosts(hosts), mode, svb, dwbp,
                                fuse_bytes))
    return out, baseline
