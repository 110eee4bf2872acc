"""The cluster simulator (poseidon_caffe/simulator): schedules worked out by hand, the link
model's bytes against the planner's, the compute file forms (and what `time` prints), the
command's table, JSON and plot, and one clear line for each kind of bad input."""
import json
import logging
import os
import subprocess
import sys

import pytest

from poseidon_caffe.simulator import compute, model as net_models, rates, schedule
from poseidon_caffe.simulator.compute import LayerTimes
from poseidon_caffe.simulator.model import FactorShape, NetModel, Param, SimulationError
from poseidon_caffe.tools.simulate import simulate_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# data -> ip1 (weight 100 x 250) -> ip2 (weight 50 x 100) -> loss, batch 8
LAYERS = ["data", "ip1", "ip2", "loss"]
TYPES = ["Input", "InnerProduct", "InnerProduct", "SoftmaxWithLoss"]
FORWARD_MS = [0.0, 30.0, 10.0, 0.0]
BACKWARD_MS = [0.0, 40.0, 20.0, 0.0]
MB_PER_S = 1e6


def two_layer_model():
    ip1 = Param(0, "ip1[0]", (100, 250), ready_layer=1, first_use=1,
                sfb=FactorShape(250, 100, 8))
    ip2 = Param(1, "ip2[0]", (50, 100), ready_layer=2, first_use=2,
                sfb=FactorShape(100, 50, 8))
    return NetModel("two", LAYERS, TYPES, [ip1, ip2], batch=8)


def times():
    return LayerTimes(FORWARD_MS, BACKWARD_MS)


def run(hosts=2, dwbp=True, mode="ps", latency=0.0, gpus=1, channels=1, local=1e12,
        efficiency=1.0, update_rate=None, **host_cpu):
    cluster = schedule.Cluster(hosts, MB_PER_S, gpus_per_node=gpus, latency=latency,
                               local_bandwidth=local, channels=channels,
                               wire_efficiency=efficiency, update_rate=update_rate, **host_cpu)
    return schedule.simulate(two_layer_model(), times(), cluster, mode=mode, dwbp=dwbp)


# -- schedules by hand ------------------------------------------------------------------------
# ps on 2 hosts: each host sends (and receives) a blob's full size per iteration (push its
# half to the other shard, serve the other host's push to its own half, the same for pulls):
# ip1 is 100,000 bytes -> 100 ms at 1 MB/s, ip2 20,000 bytes -> 20 ms.

def test_one_node_is_compute_alone():
    p = run(hosts=1)
    assert p.iter_s == pytest.approx(0.100)
    assert p.comm_s == 0 and p.host_bytes == 0


def test_dwbp_on_by_hand():
    # backward: ip2 done at 60 ms (exchange 60-80), ip1 at 100 ms (exchange 100-200); the next
    # forward of ip1 waits until 200, then 30 + 10 + 20 + 40 ms of compute: a 200 ms period
    p = run(dwbp=True)
    assert p.iter_s == pytest.approx(0.200)
    assert p.compute_s == pytest.approx(0.100)
    assert p.comm_s == pytest.approx(0.120)
    assert p.hidden_share == pytest.approx(1 - 0.100 / 0.120)


def test_dwbp_off_by_hand():
    # both exchanges start after backward (100 ms): ip2 100-120, ip1 120-220
    p = run(dwbp=False)
    assert p.iter_s == pytest.approx(0.220)
    assert p.hidden_share == pytest.approx(0.0)


def test_latency_is_paid_per_round():
    # ps: push and pull, 2 rounds of 5 ms per exchange
    assert run(dwbp=True, latency=0.005).iter_s == pytest.approx(0.210)
    assert run(dwbp=False, latency=0.005).iter_s == pytest.approx(0.240)


def test_sufficient_factors_by_hand():
    # K=8 rows: ip1 sends and receives 8 x (250 + 100) floats = 11,200 bytes each way
    # (11.2 ms), then rebuilds the gradient from 2 workers' factors: 2 x half of its 40 ms
    # backward = 40 ms; the period is 51.2 ms of exchange + 100 ms of compute
    p = run(dwbp=True, mode="sfb")
    assert set(p.plan.values()) == {"sfb"}
    assert p.iter_s == pytest.approx(0.1512)
    assert p.host_bytes == pytest.approx(2 * (11200 + 4800))


def test_headers_and_updates_by_hand():
    # 80% of the wire is payload: ip1's 100 KB take 125 ms, ip2's 20 KB 25 ms
    assert run(dwbp=False, efficiency=0.8).iter_s == pytest.approx(0.100 + 0.150)
    # 1e6 values updated per second: a ps shard updates half of each blob (12,500 + 2,500
    # values: 15 ms); allreduce updates all of it on every worker (30 ms)
    assert run(dwbp=False, update_rate=1e6).iter_s == pytest.approx(0.220 + 0.015)
    assert run(dwbp=False, mode="allreduce", update_rate=1e6).iter_s == \
        pytest.approx(0.220 + 0.030)


def test_the_report_gives_bytes_per_host_in_mib_named_so():
    from poseidon_caffe.simulator import report
    p = run(dwbp=True, mode="sfb")                 # 32,000 bytes per host, as above
    row, = report.rows([p], p)
    assert row["mib_per_host"] == pytest.approx(32000 / 1048576.0)
    head, line = report.table([row]).splitlines()
    assert head.split()[-1] == "MiB/host" and line.split()[-1] == "0.0"
    assert "MB" not in head


def test_auto_takes_the_planners_choice():
    # factors are far cheaper than the matrices here
    assert set(run(mode="auto").plan.values()) == {"sfb"}


def test_device_level_adds_the_on_host_sum_and_broadcast():
    # 2 GPUs per node, 1 MB/s between them: ip1's 100,000 bytes are summed into the leader
    # and handed back (200 ms) before the wire (100 ms)
    p = run(dwbp=False, gpus=2, local=MB_PER_S)
    # ip2: 40 ms on host + 20 ms wire; ip1: 200 + 100; all after backward
    assert p.iter_s == pytest.approx(0.100 + 0.060 + 0.300)


def test_exchanges_in_flight_share_the_wire():
    model = two_layer_model()
    plan, exchanges = schedule.plan_exchanges(model, times(), schedule.Cluster(2, MB_PER_S, wire_efficiency=1.0),
                                              mode="ps")
    tasks = [schedule._Task(e, 0.0) for e in exchanges]
    schedule.run_exchanges(tasks, schedule.Cluster(2, MB_PER_S, channels=2, wire_efficiency=1.0))
    ends = sorted(t.end for t in tasks)
    # both on the wire at half the rate: the 20 KB one ends at 40 ms, the other at 120 ms
    assert ends == [pytest.approx(0.040), pytest.approx(0.120)]
    tasks = [schedule._Task(e, 0.0) for e in exchanges]
    schedule.run_exchanges(tasks, schedule.Cluster(2, MB_PER_S, channels=1, wire_efficiency=1.0))
    assert sorted(t.end for t in tasks) == [pytest.approx(0.020), pytest.approx(0.120)]
    # 0: a channel per bucket, as with 2 here
    tasks = [schedule._Task(e, 0.0) for e in exchanges]
    schedule.run_exchanges(tasks, schedule.Cluster(2, MB_PER_S, channels=0, wire_efficiency=1.0))
    assert sorted(t.end for t in tasks) == [pytest.approx(0.040), pytest.approx(0.120)]


def test_channels_start_in_bucket_order_and_the_thread_runs_one_update_at_a_time():
    # three exchanges at t=0, 1 MB/s, no sharing effects to speak of: A (10 KB), B (10 KB),
    # C (10 KB); 2 channels. A and B start at 0 and share the wire: both end their wire at
    # 20 ms; C rides A's channel and starts when A ends.
    def exchange(index, post):
        return schedule.Exchange(index, "e%d" % index, "allreduce", [], 0, 10000.0, 0.0, post,
                                 20000.0)
    cluster = schedule.Cluster(2, MB_PER_S, channels=2, wire_efficiency=1.0)
    tasks = [schedule._Task(exchange(i, 0.0), 0.0) for i in range(3)]
    schedule.run_exchanges(tasks, cluster)
    assert [(t.start, t.end) for t in tasks] == [
        (0, pytest.approx(0.020)), (0, pytest.approx(0.020)),
        (pytest.approx(0.020), pytest.approx(0.030))]
    # 5 ms of update after each wire, on the one communication thread: A's update 20-25 ms,
    # B's waits for it (25-30 ms); C starts when A ends (25 ms), wire 25-35, update 35-40
    tasks = [schedule._Task(exchange(i, 0.005), 0.0) for i in range(3)]
    schedule.run_exchanges(tasks, cluster)
    assert [t.end for t in tasks] == [pytest.approx(0.025), pytest.approx(0.030),
                                      pytest.approx(0.040)]
    assert tasks[2].start == pytest.approx(0.025)


def test_default_channels_are_the_engines():
    from poseidon_caffe.sync import engine
    assert schedule.CHANNELS == engine.CHANNELS


def test_link_bytes_are_the_planners_prediction():
    from poseidon_caffe.sync import planner
    model = two_layer_model()
    for hosts in (2, 4, 8):
        for mode in ("ps", "sfb", "allreduce"):
            cluster = schedule.Cluster(hosts, MB_PER_S, wire_efficiency=1.0)
            _, exchanges = schedule.plan_exchanges(model, times(), cluster, mode=mode)
            _, predicted = planner.make_plan(model.params, mode, lambda p: 8,
                                             (hosts, hosts, 1), announce=False)
            assert sum(e.host_bytes for e in exchanges) == pytest.approx(
                sum(predicted.values()))
            assert all(e.wire_bytes == pytest.approx(e.host_bytes / 2) for e in exchanges)
    # the ring by hand at 4 hosts: 2 x 3/4 of each blob each way
    _, exchanges = schedule.plan_exchanges(model, times(), schedule.Cluster(4, MB_PER_S, wire_efficiency=1.0),
                                           mode="allreduce")
    assert sum(e.wire_bytes for e in exchanges) == pytest.approx(2 * 0.75 * 4 * 30000)


# -- the host's cores by hand --------------------------------------------------------------
# The same two layers, ps, DWBP on, one channel. Without CPU costs (above): ip2's exchange
# 60-80 ms beside ip1's backward (60-100), ip1's 100-200, a 200 ms period.

def test_max_min_shares_by_hand():
    assert schedule.share_cores([1.0, 1.0, 0.2], 1.0) == [pytest.approx(0.4),
                                                           pytest.approx(0.4), 0.2]
    assert schedule.share_cores([1.0, 0.0, 0.5], 2.0) == [1.0, 0.0, 0.5]
    assert schedule.share_cores([1.0, 3.0], 2.0) == [1.0, 1.0]
    assert schedule.share_cores([1.0, 3.0], None) == [1.0, 3.0]


def test_cpu_per_round_by_hand():
    # 5 ms a round, 2 rounds for ps: 10 ms of the communication thread's CPU per exchange.
    # With a core per thread (no cores given) it only delays the exchange: ip2's 60-70 cpu,
    # 70-90 wire; ip1's backward ends at 100, its exchange 100-110 cpu, 110-210 wire: 210.
    assert run(cpu_per_round=0.005).iter_s == pytest.approx(0.210)
    # One core: ip2's cpu shares it with ip1's backward, half each: 60-80 (compute does 10
    # of its 40 ms), wire 80-100 (compute alone: 30 ms by 100), ip1's backward ends at 110;
    # ip1's exchange 110-220 with the compute waiting for it: a 220 ms period, 10 ms of
    # compute lost to the exchange's CPU.
    p = run(cpu_per_round=0.005, cores=1)
    assert p.iter_s == pytest.approx(0.220)
    assert p.compute_s == pytest.approx(0.100)
    assert p.compute_busy_s == pytest.approx(0.110)
    # two cores: the thread and the compute each have one
    assert run(cpu_per_round=0.005, cores=2).iter_s == pytest.approx(0.210)


def test_cpu_per_byte_by_hand():
    # the wire carries 1 MB/s each way: 2 MB/s sent plus received
    # 0.25 us a byte: the network stack wants half a core while on the wire. One core: the
    # stack gets its half, the compute the other half while ip2 is on the wire (60-80: 10 ms
    # of ip1's backward done, 30 left), so backward ends at 110; ip1's exchange 110-210 with
    # the compute waiting: 210 - 110 + 110 (compute 100 + 10 lost) = a 210 ms period.
    assert run(cpu_per_byte=0.25e-6, cores=1).iter_s == pytest.approx(0.210)
    # no cores given: the stack has what it wants, nothing changes
    assert run(cpu_per_byte=0.25e-6).iter_s == pytest.approx(0.200)
    # 1 us a byte: the stack wants two cores. Alone it has the one core, and the link's rate
    # is what it gives then. Beside the compute: half each, so the wire runs at half its
    # rate (ip2's 20 KB take 40 ms) and ip1's backward at half (20 of 40 ms by 100), ending
    # at 120; ip1's exchange alone at the full rate: 120-220. Period: 220 - 120 + 120.
    assert run(cpu_per_byte=1e-6, cores=1).iter_s == pytest.approx(0.220)
    # with polling beside it (a fifth of the core) the stack has 0.8 of the core and the
    # link's rate when the compute waits; beside the compute 0.4: half the rate, as above,
    # and the compute 0.4 too: ip1's backward does 16 ms by 100 and the rest, with nothing
    # in flight, by 124; ip1's exchange 124-224: a 224 ms period.
    assert run(cpu_per_byte=1e-6, cpu_polling=0.2, cores=1).iter_s == pytest.approx(0.224)
    # with a core per thread the stack gets its two cores: the link's rate, as without costs
    assert run(cpu_per_byte=1e-6).iter_s == pytest.approx(0.200)


def test_the_update_takes_its_core_from_the_compute():
    # allreduce, 1e6 values/s: ip2's update 5 ms, ip1's 25 ms, on the worker thread. A core
    # per thread: ip2 60-80 wire, 80-85 update; ip1's backward ends at 100, wire 100-200,
    # update 200-225: a 225 ms period. One core: ip2's update shares it with the backward
    # (80-90, half each), so backward ends at 105: a 230 ms period.
    assert run(mode="allreduce", update_rate=1e6).iter_s == pytest.approx(0.225)
    assert run(mode="allreduce", update_rate=1e6, cores=1).iter_s == pytest.approx(0.230)


def test_plenty_of_cores_give_the_free_schedule():
    # the shared timeline with more cores than threads is the schedule without the model
    for mode in ("ps", "sfb", "allreduce"):
        for dwbp in (True, False):
            for channels in (0, 1):
                for hosts, gpus, latency, update_rate in ((2, 1, 0.0, None),
                                                          (4, 1, 0.005, 1e6),
                                                          (2, 2, 0.001, 1e6)):
                    kwargs = dict(hosts=hosts, gpus=gpus, latency=latency, mode=mode,
                                  dwbp=dwbp, channels=channels, update_rate=update_rate,
                                  local=1e7, efficiency=0.9)
                    free, shared = run(**kwargs), run(cores=64, **kwargs)
                    assert shared.iter_s == pytest.approx(free.iter_s, abs=1e-9)
                    assert shared.comm_s == pytest.approx(free.comm_s, abs=1e-9)
                    assert free.compute_busy_s is None
                    assert shared.compute_busy_s == pytest.approx(free.compute_s)


def test_no_cores_and_no_costs_is_todays_model():
    cluster = schedule.Cluster(2, MB_PER_S)
    assert not cluster.shares_cores
    assert cluster.with_hosts(4).cores is None
    kept = schedule.Cluster(2, MB_PER_S, cores=1.5, cpu_per_byte=1e-9, cpu_per_round=1e-3,
                            cpu_polling=0.05)
    again = kept.with_hosts(8)
    assert (again.cores, again.cpu_per_byte, again.cpu_per_round, again.cpu_polling) == \
        (1.5, 1e-9, 1e-3, 0.05)
    with pytest.raises(SimulationError, match="cores_per_node"):
        schedule.Cluster(2, MB_PER_S, cores=0.5)
    with pytest.raises(SimulationError, match="0 or more"):
        schedule.Cluster(2, MB_PER_S, cpu_per_byte=-1e-9)


def test_polling_takes_its_share_while_exchanges_are_in_flight():
    # the thread wants a fifth of a core while anything is in flight. One core: ip2's
    # exchange (60-80) leaves the compute 0.8 of it, 16 of ip1's 40 ms done by 80; the rest
    # ends at 104. ip1's exchange 104-204 with the compute waiting: a 204 ms period.
    assert run(cpu_polling=0.2, cores=1).iter_s == pytest.approx(0.204)
    assert run(cpu_polling=0.2).iter_s == pytest.approx(0.200)


def test_the_calibration_reads_its_costs_back():
    from poseidon_caffe.simulator import calibration
    # three phases made by hand as the model has them with one core: polling takes 0.1 of
    # it; a round costs 2 us and 3 ns a byte, run at half a core; the small rounds move
    # 2 KB, the large 2 MB sent plus received
    polling, per_round, per_byte = 0.1, 2e-6, 3e-9
    waiting = {"busy_s": 1.6, "lost_s": 0.16}
    small = {"bytes": 2048.0, "rounds": 1000.0, "busy_s": 1.7}
    large = {"bytes": 2097152.0, "rounds": 50.0, "busy_s": 1.9}
    for phase in (small, large):
        work = phase["rounds"] * (per_round + per_byte * phase["bytes"])
        phase["lost_s"] = work + polling * (phase["busy_s"] - 2 * work)
    got = calibration.costs(waiting, small, large)
    assert got == (pytest.approx(polling), pytest.approx(per_round), pytest.approx(per_byte))
    # noise that makes a cost negative reads as none
    none = dict(waiting, lost_s=-0.1)
    assert calibration.costs(none, dict(small, lost_s=0.0), dict(large, lost_s=0.0)) == \
        (0.0, 0.0, 0.0)
    # rounds under way when the compute ended count by the share done
    assert calibration.rounds_within(0.0, [1.0, 2.0, 4.0, 5.0], 3.0) == pytest.approx(2.5)
    assert calibration.rounds_within(0.0, [4.0], 1.0) == pytest.approx(0.25)
    assert calibration.combine([
        {"cpu_per_byte": 1e-9, "cpu_per_round": 1e-3, "cpu_polling": 0.1},
        {"cpu_per_byte": 3e-9, "cpu_per_round": 3e-3, "cpu_polling": 0.3}]) == {
        "cpu_per_byte": pytest.approx(2e-9), "cpu_per_round": pytest.approx(2e-3),
        "cpu_polling": pytest.approx(0.2)}


# -- nets, compute files, rates ---------------------------------------------------------------
TINY = """name: "tiny"
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 4 dim: 6 } shape { dim: 4 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.prototxt"
    path.write_text(TINY)
    return str(path)


def test_a_net_model_has_the_engines_blobs(tiny):
    m, _ = net_models.load(tiny)
    assert m.batch == 4
    assert [(p.name, p.shape, p.ready_layer) for p in m.params] == [
        ("ip1[0]", (5, 6), 1), ("ip1[1]", (5,), 1), ("ip2[0]", (3, 5), 3), ("ip2[1]", (3,), 3)]
    assert (m.params[0].sfb.M, m.params[0].sfb.N, m.params[0].sfb.rows_per_pass) == (6, 5, 4)
    assert m.params[1].sfb is None


def test_the_example_nets_load_with_their_data_layers_as_inputs():
    m, _ = net_models.load(os.path.join(ROOT, "examples", "alexnet", "train_val.prototxt"))
    assert m.batch == 256
    # AlexNet (grouped conv2, conv4, conv5): 60,965,224 learnable values
    assert sum(p.count for p in m.params) == 60965224
    m, _ = net_models.load(os.path.join(ROOT, "examples", "googlenet", "train_val.prototxt"))
    assert sum(p.count for p in m.params) > 6e6


def write_forms(tmp_path, rows, batch=None):
    csv_path = tmp_path / "t.csv"
    csv_path.write_text(("# batch: %d\n" % batch if batch else "") + "layer,forward_ms,backward_ms\n"
                        + "".join("%s,%s,%s\n" % r for r in rows))
    json_path = tmp_path / "t.json"
    doc = {"layers": [{"name": n, "forward_ms": f, "backward_ms": b} for n, f, b in rows]}
    if batch:
        doc["batch"] = batch
    json_path.write_text(json.dumps(doc))
    return str(csv_path), str(json_path)


def test_compute_files_csv_and_json_agree(tiny, tmp_path):
    m, _ = net_models.load(tiny)
    rows = [("data", 0, 0), ("ip1", 1.5, 3), ("relu", 0.25, 0.5), ("ip2", 1, 2), ("loss", 0.5, 1)]
    for path in write_forms(tmp_path, rows):
        t = compute.read_compute_file(path, m)
        assert t.forward_ms == [0, 1.5, 0.25, 1, 0.5]
        assert t.backward_ms == [0, 3, 0.5, 2, 1]
    # times taken at batch 2 scale to the net's batch 4
    for path in write_forms(tmp_path, rows, batch=2):
        t = compute.read_compute_file(path, m)
        assert t.forward_ms == [0, 3, 0.5, 2, 1]
        assert "batch 2" in t.note


def test_a_bench_gpu_report_gives_the_times_of_the_net_with_these_layers(tiny, tmp_path):
    m, _ = net_models.load(tiny)

    def net(names, scale, batch):
        return {"batch": batch, "ours_ms": 1.0,
                "layers": [{"name": n, "type": "T", "forward_ms": scale * (k + 1),
                            "backward_ms": 2 * scale * (k + 1)} for k, n in enumerate(names)]}
    report = {"device": "Tesla X", "emulated": False, "iters": 3, "nets": {
        "lenet": net(["data", "conv1", "pool1", "ip1", "loss"], 9, 64),
        "tiny": net(["data", "ip1", "relu", "ip2", "loss"], 0.5, 2)}}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(report))
    t = compute.read_compute_file(str(path), m)
    # tiny's rows, taken at batch 2, scaled to the net's batch 4
    assert t.forward_ms == [1, 2, 3, 4, 5] and t.backward_ms == [2, 4, 6, 8, 10]
    assert "per-layer times of tiny from bench_gpu on Tesla X" in t.note and "batch 2" in t.note
    del report["nets"]["tiny"]
    path.write_text(json.dumps(report))
    with pytest.raises(compute.SimulationError, match=r"bench_gpu report of net lenet, none of "
                                                      r"them with the layers of net tiny"):
        compute.read_compute_file(str(path), m)


def test_what_time_prints_is_a_compute_file(tiny, tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-m", "poseidon_caffe.cli", "time", "-model=" + tiny,
                           "-iterations=2"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    log_path = tmp_path / "time.log"
    log_path.write_text(done.stdout + done.stderr)
    m, _ = net_models.load(tiny)
    t = compute.read_compute_file(str(log_path), m)
    assert len(t.forward_ms) == 5 and t.total_ms > 0
    # the log's own numbers, read back
    for line in (done.stdout + done.stderr).splitlines():
        if "ip2\tforward:" in line:
            assert t.forward_ms[3] == pytest.approx(float(line.split("forward:")[1].split()[0]))


def test_rates_as_tc_writes_them():
    assert rates.parse_rate("10gbit") == pytest.approx(1.25e9)
    assert rates.parse_rate("100mbit") == pytest.approx(12.5e6)
    assert rates.parse_rate("1.5Gbit") == pytest.approx(1.5e9 / 8)
    assert rates.parse_rate("12.5MB/s") == pytest.approx(12.5e6)
    assert rates.parse_delay("50us") == pytest.approx(50e-6)
    assert rates.parse_delay("0.2ms") == pytest.approx(2e-4)
    assert rates.parse_delay("0") == 0
    for bad in ("10gbe", "fast", "-1gbit", "0gbit", "10 g"):
        with pytest.raises(rates.RateError, match="-bandwidth"):
            rates.parse_rate(bad)


# -- the command ------------------------------------------------------------------------------
def test_the_command_prints_a_row_per_node_count_and_writes_json_and_plot(tiny, tmp_path,
                                                                          capsys):
    pytest.importorskip("matplotlib")
    rows = [("data", 0, 0), ("ip1", 1, 2), ("relu", 0, 0), ("ip2", 1, 2), ("loss", 0, 0)]
    csv_path, _ = write_forms(tmp_path, rows)
    out_json, out_png = str(tmp_path / "rows.json"), str(tmp_path / "s.png")
    assert simulate_main(["-model", tiny, "-nodes", "1,2,4", "-bandwidth", "100kbit",
                          "-compute", csv_path, "-json", out_json, "-plot", out_png]) == 0
    text = capsys.readouterr().out
    table = text.splitlines()[2:]                   # after the inputs and the compute line
    assert table[0].split()[:5] == ["nodes", "gpus", "iter_ms", "images/s", "speedup"]
    assert [line.split()[0] for line in table[1:]] == ["1", "2", "4"]
    doc = json.load(open(out_json))
    assert [r["nodes"] for r in doc["rows"]] == [1, 2, 4]
    assert doc["rows"][0]["speedup"] == pytest.approx(1.0)
    assert doc["rows"][0]["iter_ms"] == pytest.approx(6.0)
    # the speedup is throughput over one node's
    r = doc["rows"][2]
    assert r["speedup"] == pytest.approx(4 * 6.0 / r["iter_ms"])
    with open(out_png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_measured_compute_times_the_net_here(tiny, capsys):
    assert simulate_main(["-model", tiny, "-nodes", "1,2", "-compute", "measured",
                          "-iterations", "2"]) == 0
    assert "measured" in capsys.readouterr().out


def test_the_output_says_where_the_compute_times_came_from(tiny, tmp_path, capsys):
    rows = [("data", 0, 0), ("ip1", 1, 2), ("relu", 0, 0), ("ip2", 1, 2), ("loss", 0, 0)]
    csv_path, _ = write_forms(tmp_path, rows)
    said = {}
    for compute_flag in ("measured", csv_path, "total=6"):
        out_json = str(tmp_path / "rows.json")
        assert simulate_main(["-model", tiny, "-nodes", "1,2", "-compute", compute_flag,
                              "-iterations", "1", "-json", out_json]) == 0
        head = capsys.readouterr().out.splitlines()[:2]
        # times taken on this CPU are not a GPU's: the header speaks of workers
        assert "GPU(s)" not in head[0] and "per GPU" not in head[0], head
        assert head[0].startswith("tiny: batch 4 per worker, 1 worker(s) per node")
        assert head[1].startswith("compute: ")
        said[compute_flag] = head[1]
        assert json.load(open(out_json))["inputs"]["compute_source"] in head[1]
    assert "measured on this CPU" in said["measured"] and "not a GPU" in said["measured"]
    assert said[csv_path] == "compute: 6.0 ms per worker and iteration, read from " + csv_path
    assert "given as total=6 ms" in said["total=6"]


def run_measured_on_a_terminal(tiny):
    """``simulate -compute measured`` with stderr on a pseudo-terminal: what it drew there."""
    import pty
    import select
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items()
           if k not in ("POSEIDON_NO_PROGRESS", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE")}
    env["PYTHONPATH"] = ROOT
    proc = subprocess.Popen([sys.executable, "-m", "poseidon_caffe.cli", "simulate", "-model",
                             tiny, "-nodes", "1,2", "-iterations", "2"], stdout=subprocess.PIPE,
                            stderr=slave, env=env)
    os.close(slave)
    drawn = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 120)
            assert ready, "no output for 120 s"
            try:
                chunk = os.read(master, 4096)
            except OSError:                 # the child closed the terminal
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(master)
    out = proc.stdout.read().decode()
    assert proc.wait(timeout=120) == 0, drawn
    return drawn.decode(), out


def test_measuring_says_so_and_shows_progress_on_a_terminal(tiny):
    drawn, out = run_measured_on_a_terminal(tiny)
    assert "timing the 5 layers of %s at batch 4 on this CPU" % tiny in drawn
    # 5 layers' forward and backward, 1 untimed + 2 timed passes: 30 steps, the last drawn
    assert "Timing on this CPU [" in drawn
    assert "30/30 layer steps" in drawn
    assert drawn.endswith("\r\x1b[K")     # the bar is wiped before the table is read
    assert "measured on this CPU" in out


def test_measuring_off_a_terminal_is_one_line_and_no_bar(tiny):
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-m", "poseidon_caffe.cli", "simulate", "-model",
                           tiny, "-nodes", "1,2", "-iterations", "1"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "timing the 5 layers" in lines[0], done.stderr
    assert "\x1b" not in done.stderr


def one_error_line(argv, caplog):
    """The command fails with exactly one warning-or-worse record, and returns its text."""
    caplog.clear()
    code = simulate_main(argv)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert code == 1
    assert len(said) == 1 and "\n" not in said[0], said
    return said[0]


NO_PARAMS = """name: "flat"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "relu" type: "ReLU" bottom: "data" top: "out" }
"""


def test_bad_input_is_one_clear_line(tiny, tmp_path, caplog):
    flat = tmp_path / "flat.prototxt"
    flat.write_text(NO_PARAMS)
    line = one_error_line(["-model", str(flat), "-compute", "total=5"], caplog)
    assert "flat" in line and "no learnable parameters" in line
    line = one_error_line(["-model", tiny, "-bandwidth", "10gbe"], caplog)
    assert "-bandwidth='10gbe'" in line
    line = one_error_line(["-model", tiny, "-nodes", "1,two"], caplog)
    assert "-nodes='1,two'" in line
    partial = tmp_path / "partial.csv"
    partial.write_text("layer,forward_ms,backward_ms\nip1,1,2\n")
    line = one_error_line(["-model", tiny, "-compute", str(partial)], caplog)
    assert "partial.csv" in line and "relu" in line and "ip2" in line
    broken = tmp_path / "broken.csv"
    broken.write_text("layer,forward_ms,backward_ms\nip1,fast,2\n")
    line = one_error_line(["-model", tiny, "-compute", str(broken)], caplog)
    assert "broken.csv: line 2 forward_ms" in line
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"layers": [{"name": "conv9", "forward_ms": 1, "backward_ms": 1}]}')
    line = one_error_line(["-model", tiny, "-compute", str(wrong)], caplog)
    assert "wrong.json: layers[0]" in line and "conv9" in line
    line = one_error_line(["-model", tiny, "-compute", str(tmp_path / "none.csv")], caplog)
    assert "none.csv" in line
    line = one_error_line(["-model", tiny, "-sync", "gossip", "-compute", "total=5"], caplog)
    assert "-sync=gossip" in line
    for flag, value in (("cores_per_node", "0.5"), ("cores_per_node", "many"),
                        ("cpu_per_byte", "-0.5"), ("cpu_per_byte", "cheap"),
                        ("cpu_per_round", "-1ms"), ("cpu_per_round", "fast"),
                        ("cpu_polling", "1.5"), ("cpu_polling", "some")):
        line = one_error_line(["-model", tiny, "-compute", "total=5", "-" + flag, value],
                              caplog)
        assert "-" + flag in line and value in line, line


def test_the_command_takes_the_host_cpu_model(tiny, tmp_path, capsys):
    rows = [("data", 0, 0), ("ip1", 1, 2), ("relu", 0, 0), ("ip2", 1, 2), ("loss", 0, 0)]
    csv_path, _ = write_forms(tmp_path, rows)
    out = []
    for extra in ([], ["-cores_per_node", "1", "-cpu_per_round", "1ms"]):
        path = str(tmp_path / ("rows%d.json" % len(out)))
        assert simulate_main(["-model", tiny, "-nodes", "1,2", "-bandwidth", "100kbit",
                              "-compute", csv_path, "-json", path] + extra) == 0
        out.append(json.load(open(path)))
    plain, shared = out
    assert plain["inputs"]["cores_per_node"] is None
    assert shared["inputs"]["cores_per_node"] == 1.0
    # one node exchanges nothing: the same; two pay 2 rounds of 1 ms for each exchange
    assert shared["rows"][0]["iter_ms"] == pytest.approx(plain["rows"][0]["iter_ms"])
    assert shared["rows"][1]["iter_ms"] > plain["rows"][1]["iter_ms"]


def test_simulate_answers_help(capsys):
    from poseidon_caffe.tools.main import main
    assert main(["simulate", "-help"]) == 0
    out = capsys.readouterr().out
    assert "-bandwidth" in out and "-compute" in out


def test_a_net_without_parameters_is_one_line_on_stderr(tmp_path):
    flat = tmp_path / "flat.prototxt"
    flat.write_text(NO_PARAMS)
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-m", "poseidon_caffe.cli", "simulate", "-model",
                           str(flat), "-compute", "total=5"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no learnable parameters" in lines[0], done.stderr


# -- against the real engine on a shaped network ----------------------------------------------
def _validation_script():
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "validate_simulator", os.path.join(ROOT, "scripts", "validate_simulator.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.mpi
def test_prediction_is_near_a_real_job_on_a_shaped_network(tmp_path):
    """2 hosts at 100mbit, the ring, DWBP off: the wire is the wait (about 0.8 s of exchange
    to some 50 ms of compute), so the measurement is stable enough to compare. The bound is
    looser than the 15% the simulator meets on a quiet machine (docs/SIMULATION.md has the
    table): on 2 shared cores the MPI stack and the shaping run on the cores the job uses."""
    from poseidon_caffe import netlab
    try:
        netlab.require_root_and_tools()
    except netlab.LabError as exc:
        pytest.skip(str(exc))
    script = _validation_script()
    ranks, wire = script.measure(2, "100mbit", "allreduce", False, 4, str(tmp_path))
    measured = max(r["seconds"] for r in ranks)
    predicted = script.predict(ranks, 2, "100mbit", "allreduce", False)
    # the engine moved the planner's bytes, which the link model prices
    assert ranks[0]["bytes"] == pytest.approx(predicted.host_bytes, rel=1e-6)
    assert predicted.iter_s == pytest.approx(measured, rel=0.30)
