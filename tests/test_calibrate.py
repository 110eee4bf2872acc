"""``poseidon-caffe calibrate``: the simulator's link and host-CPU figures measured by a real
mpiexec job, printed as flags that ``simulate`` takes back; bad input in one line."""
import json
import os
import subprocess
import sys

import pytest

from poseidon_caffe.tools import calibrate
from poseidon_caffe.tools import flags as flagmod
from poseidon_caffe.tools.simulate import SIMULATE_FLAGS, simulate_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")

NET = """name: "small"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 8 dim: 1 dim: 12 dim: 12 } } }
layer { name: "label" type: "Input" top: "label" input_param { shape { dim: 8 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip" inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.prototxt"
    path.write_text(NET)
    return str(path)


def _rank(rate, latency, polling, per_round, per_byte):
    return {"rate_bytes_per_s": rate, "latency_s": latency,
            "host_cpu": {"cpu_polling": polling, "cpu_per_round": per_round,
                         "cpu_per_byte": per_byte}}


def test_the_ranks_figures_become_simulate_flags():
    ranks = [_rank(12.5e6, 2e-4, 0.1, 1e-4, 2e-8), _rank(10e6, 5e-4, 0.2, 3e-4, 4e-8),
             _rank(11e6, 1e-4, 0.3, 2e-4, 6e-8)]
    figures = calibrate.combined(ranks)
    # the slowest link, the median latency, the mean of each cost
    assert figures["bandwidth_bytes_per_s"] == 10e6
    assert figures["latency_s"] == 2e-4
    assert figures["cpu_polling"] == pytest.approx(0.2)
    assert figures["cpu_per_round"] == pytest.approx(2e-4)
    assert figures["cpu_per_byte"] == pytest.approx(4e-8)
    flags = calibrate.simulate_flags(figures)
    assert flags == ("-bandwidth 80.0mbit -wire_efficiency 1 -latency 0.2000ms "
                     "-cores_per_node 1 -cpu_polling 0.200 -cpu_per_round 0.2000ms "
                     "-cpu_per_byte 4e-08")
    values, args = flagmod.parse(flags.split(), SIMULATE_FLAGS)
    assert not args
    assert values["cores_per_node"] == 1 and values["cpu_polling"] == pytest.approx(0.2)
    assert values["cpu_per_byte"] == pytest.approx(4e-8)


def test_costs_follow_the_model_and_a_wait_of_half_a_core_leaves_the_rounds_at_zero():
    """lost = rounds x work + polling x (busy - rounds x 2 x work), worked by hand: polling
    0.2; small rounds (0.3 - 0.2) / (100 x 0.6) = 1/600 s, large (0.5 - 0.2) / 60 = 1/200 s, a
    byte (1/200 - 1/600) / 1e6 s. A wait that took half a core or more (a busy machine) leaves
    the rounds no share to be told by: 0, not a division by zero."""
    from poseidon_caffe.simulator import calibration
    small = {"lost_s": 0.3, "busy_s": 1.0, "rounds": 100, "bytes": 1000}
    large = {"lost_s": 0.5, "busy_s": 1.0, "rounds": 100, "bytes": 1001000}
    polling, per_round, per_byte = calibration.costs({"lost_s": 0.2, "busy_s": 1.0}, small,
                                                     large)
    assert polling == pytest.approx(0.2)
    assert per_byte == pytest.approx((1 / 200 - 1 / 600) / 1e6)
    assert per_round == pytest.approx(1 / 600 - per_byte * 1000)
    assert calibration.costs({"lost_s": 0.7, "busy_s": 1.0}, small, large) == (0.5, 0.0, 0.0)


@pytest.mark.mpi
def test_a_two_rank_job_measures_what_simulate_takes(small, tmp_path):
    out = tmp_path / "calibration.json"
    env = dict(os.environ, PYTHONPATH=ROOT, POSEIDON_NO_PROGRESS="1", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")
    done = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "poseidon_caffe.cli",
                           "calibrate", "-model", small, "-seconds", "0.2", "-json", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("simulate flags: ")]
    assert len(lines) == 1, done.stdout          # rank 0 alone prints
    report = json.loads(out.read_text())
    assert report["nodes"] == 2 and [r["rank"] for r in report["ranks"]] == [0, 1]
    for rank in report["ranks"]:
        # loopback moves 4 MB in well under a second, and the compute was timed
        assert rank["rate_bytes_per_s"] > 4e6 and 0 <= rank["latency_s"] < 0.05
        assert rank["host_cpu"]["calls"] >= 2 and rank["host_cpu"]["work_alone_s"] > 0
        for key in ("cpu_polling", "cpu_per_round", "cpu_per_byte"):
            assert rank["host_cpu"][key] >= 0
    assert report["simulate_flags"] == lines[0][len("simulate flags: "):]
    # what it printed is what simulate reads back, and simulate predicts with it
    values, _ = flagmod.parse(lines[0].split()[2:] + ["-model", small, "-nodes", "1,2",
                                                      "-compute", "total=5"], SIMULATE_FLAGS)
    assert values["bandwidth"].endswith("mbit") and values["cores_per_node"] == 1
    assert values["wire_efficiency"] == 1
    combined = report["combined"]
    assert float(values["bandwidth"][:-4]) * 1e6 / 8 == pytest.approx(
        combined["bandwidth_bytes_per_s"], rel=1e-3)
    rows, inputs = simulate_rows(values)
    assert [row["nodes"] for row in rows] == [1, 2] and rows[1]["iter_ms"] >= 5.0 - 1e-6
    assert inputs["cpu_per_byte"] == pytest.approx(combined["cpu_per_byte"], rel=1e-2)


def _calibrate(argv, env=None):
    return subprocess.run([sys.executable, "-m", "poseidon_caffe.cli", "calibrate"] + argv,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT, **(env or {})))


@pytest.mark.parametrize("argv,says", [
    ([], "calibrate needs a net: -model=NET.prototxt"),
    (["-model", "NET", "-seconds", "0"], "-seconds=0: each timed phase lasts more than 0 s"),
    (["-model", "NET", "extra"], "unexpected argument(s): extra"),
    (["-model", "NET"], "run it under mpiexec with one rank per node, 2 or more"),
    (["-model", "/nonexistent/net.prototxt"], "/nonexistent/net.prototxt"),
])
def test_bad_input_is_one_line(small, argv, says):
    done = _calibrate([small if a == "NET" else a for a in argv])
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and says in errors[0], done.stderr
    assert "Traceback" not in done.stderr
