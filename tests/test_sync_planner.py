"""SACP planner: for AlexNet's and GoogLeNet's parameter blobs at chosen K, P, S the choice is
the cheapest under Poseidon's cost model, computed here from the formulas; and the strategies'
prices are those formulas."""
import pytest

from poseidon_caffe.sync import planner
from poseidon_caffe.sync.engine import FactorSource


class FakeItem:
    def __init__(self, name, rows, cols, fc):
        self.index = 0
        self.name = name
        self.count = rows * cols
        self.rows = rows
        self.sfb = FactorSource(cols, rows, read=None) if fc else None


# (name, N rows = outputs, M = inputs per output, fully connected?)
ALEXNET = [("conv1", 96, 3 * 11 * 11, False), ("conv2", 256, 48 * 5 * 5, False),
           ("conv3", 384, 256 * 3 * 3, False), ("conv4", 384, 192 * 3 * 3, False),
           ("conv5", 256, 192 * 3 * 3, False), ("fc6", 4096, 9216, True),
           ("fc7", 4096, 4096, True), ("fc8", 1000, 4096, True)]
GOOGLENET = [("conv1/7x7_s2", 64, 3 * 7 * 7, False), ("inception_5b/5x5", 128, 48 * 25, False),
             ("loss1/fc", 1024, 2048, True), ("loss1/classifier", 1000, 1024, True),
             ("loss3/classifier", 1000, 1024, True)]


def model_costs(M, N, K, P, S, fc):
    """Poseidon's cost model, bytes (float32) sent plus received per host and iteration."""
    costs = {"ps": 4 * 2.0 * M * N * (P + S - 2) / S,
             "allreduce": 4 * 2.0 * 2 * M * N * (P - 1) / P}
    if fc:
        costs["sfb"] = 4 * 2.0 * K * (P - 1) * (M + N)
    return costs


@pytest.mark.parametrize("K,P,S", [(32, 2, 2), (256, 8, 8), (64, 4, 4), (2048, 16, 16),
                                   (128, 8, 1)])
@pytest.mark.parametrize("layer", ALEXNET + GOOGLENET, ids=lambda l: l[0])
def test_choice_is_the_cheapest_under_the_cost_model(layer, K, P, S):
    name, N, M, fc = layer
    item = FakeItem(name, N, M, fc)
    costs = model_costs(M, N, K, P, S, fc)
    best = min(costs.values())
    expected = [n for n in ("ps", "sfb", "allreduce") if n in costs and costs[n] == best][0]
    assert planner.choose(item, "auto", K, P, S) == expected
    assert planner.prices(item, K, P, S) == pytest.approx(costs)


def test_known_decisions():
    fc6 = FakeItem("fc6", 4096, 9216, True)
    conv1 = FakeItem("conv1", 96, 363, False)
    # small batches over few hosts: factors are far cheaper than a 4096 x 9216 matrix
    assert planner.choose(fc6, "auto", 32, 8, 8) == "sfb"
    # a huge batch over many hosts: the factors outgrow the matrix
    assert planner.choose(fc6, "auto", 8192, 16, 16) == "ps"
    # convolutions never use factors; with shards on every host ps ties the ring, and wins it
    assert planner.choose(conv1, "auto", 32, 8, 8) == "ps"
    # one shard for eight hosts makes that host the bottleneck: the ring is cheaper
    assert planner.choose(conv1, "auto", 32, 8, 1) == "allreduce"
    # -svb=false keeps the factors out of auto
    assert planner.choose(fc6, "auto", 32, 8, 8, svb=False) == "ps"


# AlexNet's shape at CIFAR-10's size (scripts/bench_sync.py's alexnet_cifar): a narrow classifier
ALEXNET_CIFAR = [("conv1", 32, 3 * 5 * 5, False), ("conv2", 32, 32 * 5 * 5, False),
                 ("conv3", 64, 32 * 5 * 5, False), ("fc6", 4096, 64 * 4 * 4, True),
                 ("fc7", 4096, 4096, True), ("fc8", 10, 4096, True)]


@pytest.mark.parametrize("P", [2, 4])
def test_auto_beats_every_forced_mode_when_layers_disagree(P):
    """At 64 images a host, fc6 and fc7 are cheaper as factors, but fc8's 4096 x 10 matrix is
    smaller than 64 x 4106 factors per peer: only the per-layer choice gets both right."""
    K = 64
    items = []
    for index, (name, N, M, fc) in enumerate(ALEXNET_CIFAR):
        item = FakeItem(name, N, M, fc)
        item.index = index
        items.append(item)
    totals, plans = {}, {}
    for mode in planner.modes():
        plan, predicted = planner.make_plan(items, mode, lambda item: K, (P, P, 1),
                                            announce=False)
        plans[mode] = [plan[item.index] for item in items]
        totals[mode] = sum(predicted.values())
    assert plans["auto"] == ["ps", "ps", "ps", "sfb", "sfb", "ps"]
    assert plans["sfb"] == ["ps", "ps", "ps", "sfb", "sfb", "sfb"]
    # the totals from the formulas: auto takes each layer's cheapest price
    costs = [model_costs(M, N, K, P, P, fc) for _, N, M, fc in ALEXNET_CIFAR]
    assert totals["auto"] == pytest.approx(sum(min(c.values()) for c in costs))
    assert totals["sfb"] == pytest.approx(sum(c.get("sfb", c["ps"]) for c in costs))
    # fc8 alone, worked out at 2 hosts: factors 2 x 64 x (4096 + 10) floats, ps 2 x 40960
    if P == 2:
        assert totals["sfb"] - totals["auto"] == 4 * 2 * (64 * 4106 - 40960)
    for mode in ("ps", "sfb", "allreduce"):
        assert totals["auto"] < 0.85 * totals[mode], mode


def test_forced_modes_and_their_limits():
    fc7 = FakeItem("fc7", 4096, 4096, True)
    conv = FakeItem("conv", 64, 27, False)
    assert planner.choose(fc7, "sfb", 32, 4, 4) == "sfb"
    assert planner.choose(conv, "sfb", 32, 4, 4) == "ps"
    assert planner.choose(fc7, "allreduce", 32, 4, 4) == "allreduce"
    assert planner.choose(fc7, "auto", 32, 4, 4, staleness=2) == "ps"
    with pytest.raises(planner.PlanError, match="staleness"):
        planner.choose(fc7, "sfb", 32, 4, 4, staleness=1)
    with pytest.raises(planner.PlanError, match="clip_gradients"):
        planner.choose(fc7, "ps", 32, 4, 4, clip=True)
    with pytest.raises(planner.PlanError, match="auto|ps|sfb|allreduce"):
        planner.choose(fc7, "gossip", 32, 4, 4)


def test_svb_means_poseidons_switch():
    fc6 = FakeItem("fc6", 4096, 9216, True)
    conv1 = FakeItem("conv1", 96, 363, False)
    # a huge batch makes the factors dearer than the matrix, yet svb sends them (Poseidon's
    # svb=true: every InnerProduct weight by sufficient factors across hosts)
    assert planner.choose(fc6, "auto", 8192, 16, 16) == "ps"
    assert planner.choose(fc6, "auto", 8192, 16, 16, svb=True) == "sfb"
    assert planner.choose(conv1, "auto", 32, 8, 8, svb=True) == "ps"
    # one host: nothing to broadcast to, the price decides (Poseidon: num_clients > 1)
    assert planner.choose(fc6, "auto", 8192, 1, 1, svb=True) == "ps"
    # a forced mode names every blob's strategy; stale-synchronous training keeps the server
    assert planner.choose(fc6, "ps", 32, 8, 8, svb=True) == "ps"
    assert planner.choose(fc6, "auto", 32, 8, 8, staleness=1, svb=True) == "ps"


def test_worker_update_rule_exchanges_update_values_not_factors():
    fc6 = FakeItem("fc6", 4096, 9216, True)
    assert planner.choose(fc6, "auto", 32, 8, 8, update="worker") in ("ps", "allreduce")
    assert planner.choose(fc6, "auto", 32, 8, 8, svb=True, update="worker") == "ps"
    with pytest.raises(planner.PlanError, match="-ps_update=worker"):
        planner.choose(fc6, "sfb", 32, 8, 8, update="worker")
    with pytest.raises(planner.PlanError, match="clip_gradients"):
        planner.choose(fc6, "allreduce", 32, 8, 8, clip=True, update="worker")
    with pytest.raises(planner.PlanError, match="-ps_update=average is not one of"):
        planner.choose(fc6, "auto", 32, 8, 8, update="average")


@pytest.mark.parametrize("count,rows,shards,piece", [
    (9216 * 4096, 4096, 2, 1 << 18),    # AlexNet's fc6: 74 pieces of 27-28 rows per shard
    (500 * 800, 500, 1, 1 << 18),       # LeNet's ip1 on one server: two pieces
    (12 * 64, 12, 4, 16),               # rows larger than a piece: a row each
    (7, 7, 3, 1 << 18),                 # a bias smaller than a piece: one each
    (10, 1, 2, 4),                      # a single row cannot be cut
])
def test_parameter_server_pieces_cover_each_shards_rows_in_order(count, rows, shards, piece):
    from poseidon_caffe.sync.shard_store import PIECE_TAGS, row_layout
    parts = row_layout(3, count, rows, shards, piece)
    per_row = count // rows
    assert len(parts) <= PIECE_TAGS
    by_shard = {}
    for shard, lo, hi in parts:
        assert lo % per_row == 0 and hi % per_row == 0 and hi > lo
        assert hi - lo <= max(piece, per_row)
        by_shard.setdefault(shard, []).append((lo, hi))
    # each shard's pieces are one contiguous run of rows, the runs tile the blob, and the
    # runs are the shards' row ranges without pieces (a near-equal split, rotated by index)
    runs = sorted((ranges[0][0], ranges[-1][1], shard) for shard, ranges in by_shard.items())
    for ranges in by_shard.values():
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert runs[0][0] == 0 and runs[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
    whole = row_layout(3, count, rows, shards, count)
    assert sorted((lo, hi, s) for s, lo, hi in whole) == runs
    pieces_of = {s: len(r) for s, r in by_shard.items()}
    if count == 9216 * 4096:
        assert pieces_of == {0: 74, 1: 74}


def planned_lines(items, mode, K, shape):
    import logging
    from poseidon_caffe import log
    lines = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    log.logger.addHandler(handler)
    try:
        planner.make_plan(items, mode, lambda item: K, shape)
    finally:
        log.logger.removeHandler(handler)
    return lines


def test_the_plans_byte_sizes_are_written_in_binary_units_named_so():
    # ps over 2 hosts and 2 shards moves 2 x 4 bytes x M x N x (P + S - 2) / S per host:
    # fc7's 4096 x 4096 floats -> 134,217,728 bytes = 128 MiB exactly; a 64 x 27
    # convolution's -> 13,824 bytes = 13.5 KiB
    lines = planned_lines([FakeItem("fc7", 4096, 4096, False)], "ps", 32, (2, 2, 1))
    assert "Sync plan: predicted 128.0 MiB off-host per host per iteration (2 hosts, 2 " \
           "shards, 1 devices per host)" in lines, lines
    assert any(line.startswith("Sync plan: fc7 (") and "ps 128.0 MiB" in line for line in lines)
    lines = planned_lines([FakeItem("conv", 64, 27, False)], "ps", 32, (2, 2, 1))
    assert any("predicted 13.5 KiB off-host" in line for line in lines), lines
    assert not any(unit in line for line in lines for unit in (" KB", " MB", " GB"))
