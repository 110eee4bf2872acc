"""A sync strategy is one class: this file defines a fourth one (every host sends its whole
summed gradient to every other host, an allgather) and registers it from here alone. The
planner offers and prices it, and on a real 2-host mpiexec run it ends with the same weights
as ring allreduce and as one worker of twice the batch, moving exactly the bytes it predicts."""
import json
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

from poseidon_caffe.sync import planner, strategy
from poseidon_caffe.sync.engine import FactorSource
from poseidon_caffe.sync.strategy import ITEMSIZE, Strategy, register

sys.path.insert(0, os.path.dirname(__file__))
import test_sync_invariant as invariant  # noqa: E402


class FullGradientAllgather(Strategy):
    """Each host leader sends its host's summed gradient to every other leader and adds up
    what it receives; the devices of a host share the leader's sum."""
    name = "allgather"
    preference = 3
    fuses = True

    @classmethod
    def price(cls, M, N, K, P, S, dedicated=False):
        return ITEMSIZE * 2.0 * M * N * (P - 1)

    def __init__(self, transport, topology, counters):
        super().__init__(transport, topology, counters)
        self.peers = topology.leaders.dup(counters) if topology.leaders is not None else None

    def run(self, bucket, payloads, clock, what):
        flat = payloads[0] if len(payloads) == 1 else np.concatenate(payloads)
        key = bucket.name
        lane = self.transport.default_channel       # the host's devices
        self.transport.drive(lane.sum_to_leader(flat, key), what)
        if self.peers is not None and self.peers.size > 1:
            comm = self.peers
            others = [p for p in range(comm.size) if p != comm.rank]
            incoming = {p: np.empty_like(flat) for p in others}
            reqs = []
            for p in others:
                reqs.append(comm.isend(flat, p, 0, key))         # counted under key
                reqs.append(comm.irecv(incoming[p], p, 0, key))
            self.transport.wait(reqs, what, [self.topology.leader_ranks[p] for p in others])
            for p in others:
                flat += incoming[p]
        self.transport.drive(lane.broadcast(flat, key), what)
        sums, offset = [], 0
        for item in bucket.items:
            sums.append(flat[offset:offset + item.count])
            offset += item.count
        return sums

    def close(self, clock=None):
        if self.peers is not None:
            self.peers.free()
            self.peers = None


@pytest.fixture
def with_allgather(monkeypatch):
    """The toy strategy registered for one test only."""
    strategy.registered()          # the built-ins register once, on first import
    monkeypatch.setattr(strategy, "_REGISTRY", dict(strategy._REGISTRY))
    register(FullGradientAllgather)


class FakeItem:
    def __init__(self, name, rows, cols, fc):
        self.index = 0
        self.name = name
        self.count = rows * cols
        self.rows = rows
        self.sfb = FactorSource(cols, rows, read=None) if fc else None


def test_planner_offers_and_prices_a_registered_strategy(with_allgather):
    assert planner.modes() == ("auto", "ps", "sfb", "allreduce", "allgather")
    fc = FakeItem("fc", 64, 100, True)
    conv = FakeItem("conv", 16, 27, False)
    M, N, K, P, S = 100, 64, 32, 4, 4
    assert planner.prices(fc, K, P, S)["allgather"] == 4 * 2.0 * M * N * (P - 1)
    assert planner.host_price("allgather", M, N, K, P, S) == 4 * 2.0 * M * N * (P - 1)
    assert planner.choose(fc, "allgather", K, P, S) == "allgather"
    assert planner.choose(conv, "allgather", K, P, S, clip=True) == "allgather"
    # it bounds no staleness: the planner says which strategies do
    with pytest.raises(planner.PlanError, match="-staleness=1 .*-sync=ps or auto"):
        planner.choose(conv, "allgather", K, P, S, staleness=1)
    # 2MN(P-1) is never below allreduce's 4MN(P-1)/P: auto does not pick it
    assert planner.choose(conv, "auto", K, P, S, clip=True) == "allreduce"
    # at P = 2 the two tie and the earlier preference wins
    assert planner.prices(conv, K, 2, 1)["allgather"] == planner.prices(conv, K, 2, 1)["allreduce"]
    assert planner.choose(conv, "auto", K, 2, 1, clip=True) == "allreduce"


def test_planner_without_the_strategy_refuses_its_name():
    assert "allgather" not in planner.modes()
    with pytest.raises(planner.PlanError,
                       match=re.escape("-sync=allgather is not one of auto|ps|sfb|allreduce")):
        planner.choose(FakeItem("conv", 16, 27, False), "allgather", 32, 2, 2)


def test_register_refuses_what_is_not_a_complete_named_strategy(with_allgather):
    class NoRun(Strategy):
        name = "norun"

        @classmethod
        def price(cls, M, N, K, P, S, dedicated=False):
            return 0.0
    with pytest.raises(TypeError, match="NoRun does not define run"):
        register(NoRun)

    class Twin(FullGradientAllgather):
        pass
    with pytest.raises(ValueError, match="two sync strategies are named 'allgather'"):
        register(Twin)

    class Auto(FullGradientAllgather):
        name = "auto"
    with pytest.raises(ValueError, match="needs a name other than"):
        register(Auto)
    with pytest.raises(TypeError, match="subclass of Strategy"):
        register(types.SimpleNamespace)


WORKER = r'''
import json, sys, types
import numpy as np
from mpi4py import MPI
sys.path.insert(0, sys.argv[1])
import test_sync_invariant as t
import test_sync_strategy_plugin as plugin
from poseidon_caffe import sync
from poseidon_caffe.sync.strategy import register
register(plugin.FullGradientAllgather)
comm = MPI.COMM_WORLD
batch, out = int(sys.argv[2]), sys.argv[3]
X, Y = t.dataset(batch * comm.size)
results, stats = {}, {}
for mode, dwbp in (("allgather", True), ("allgather", False), ("allreduce", True)):
    solver = t.make_solver(batch)
    runner = sync.attach(solver, types.SimpleNamespace(sync=mode, dwbp=dwbp, staleness=0,
                                                       ranks_per_host=1, fuse_bytes=1 << 16))
    t.train(solver, X, Y, comm.rank, batch)
    runner.finish()
    key = "%s_%d" % (mode, dwbp)
    results.update({"%s_%d" % (key, i): b.data.copy()
                    for i, b in enumerate(solver.net.learnable_params)})
    stats[key] = comm.gather(runner.engine.stats(), root=0)
if comm.rank == 0:
    np.savez(out + ".npz", **results)
    with open(out + ".json", "w") as f:
        json.dump(stats, f)
'''


@pytest.mark.mpi
def test_a_fourth_strategy_trains_like_allreduce_on_two_hosts(tmp_path):
    ranks, batch = 2, 4
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = str(tmp_path / "result")
    env = dict(os.environ, POSEIDON_NO_PROGRESS="1")
    proc = subprocess.run([invariant.MPIEXEC, "-n", str(ranks), sys.executable, str(script),
                           os.path.dirname(__file__), str(batch), out],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    weights = np.load(out + ".npz")
    with open(out + ".json") as f:
        stats = json.load(f)
    ref = invariant.reference(ranks * batch)
    for key in ("allgather_1", "allgather_0", "allreduce_1"):
        invariant.check_same(weights, ref, key)
    for i in range(len(ref)):
        np.testing.assert_allclose(weights["allgather_1_%d" % i], weights["allreduce_1_%d" % i],
                                   rtol=1e-6, atol=1e-7)
    for key in ("allgather_1", "allgather_0"):
        ranks_stats = stats[key]
        assert all(set(s["plan"].values()) == {"allgather"} for s in ranks_stats)
        # the four blobs are under 64 KiB each: one fused message per iteration
        assert len(ranks_stats[0]["buckets"]) == 1
        total = sum(int(np.prod(w.shape)) for w in ref)
        for s in ranks_stats:
            (name, predicted), = s["predicted"].items()
            assert predicted == ITEMSIZE * 2.0 * total * (ranks - 1)
            row = s["measured"][name]
            # every byte the plan predicts, no more: sent and received alike
            assert row["sent"] == row["received"] == predicted / 2


def test_the_command_line_takes_a_registered_strategy_by_name(with_allgather, monkeypatch):
    from poseidon_caffe.tools import caffe_tool as brew
    monkeypatch.setattr(brew, "world_size", lambda: 1)
    assert brew._is_distributed({"sync": "allgather"})
    with pytest.raises(brew.CommandError, match="-sync takes one of auto, .*allgather"):
        brew._is_distributed({"sync": "gossip"})


def test_every_module_of_the_strategies_package_registers_a_strategy():
    import pkgutil
    from poseidon_caffe.sync import strategies
    names = {m.name for m in pkgutil.iter_modules(strategies.__path__)}
    assert names == {"ps", "sfb", "allreduce"}
    assert {cls.name for cls in strategy.registered()} >= names
