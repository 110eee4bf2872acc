"""The real drivers without a GPU: ``scripts/gpu_check.py --rehearse`` runs, over the project's
stand-in libcuda and libcublas (tests/standin), exactly what the check runs on a GPU: for
NVIDIA's cuda-bindings and for pycuda built from its sdist, the smoke test, device_query and
the test_cuda_* files (--gpu-driver), then a 2-rank mpiexec job and bench_gpu.py. Each of
those is its own process whose exit status is checked, so a process that aborts at exit
(pycuda with a context still pushed: the stand-in aborts as pycuda does) fails here."""
import json
import os
import subprocess
import sys

import pytest

import standin

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.mpi                  # the rehearsal's last steps start mpiexec


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    try:
        stand_in = standin.prepare()
        from standin.pycuda_build import pycuda_site
        pycuda_site(stand_in)                      # built once, cached: a clear skip here
    except standin.StandInUnavailable as exc:
        pytest.skip(str(exc))
    out = tmp_path_factory.mktemp("gpu-check")
    env = dict(os.environ, STANDIN_CUDA_CHECK_EXIT="1")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_check.py"),
                           "--rehearse", "--out", str(out)], capture_output=True, text=True,
                          env=env, timeout=900)
    with open(os.path.join(str(out), "summary.json")) as f:
        return proc, json.load(f), str(out)


@pytest.mark.parametrize("driver", ["cuda-bindings", "pycuda"])
def test_each_real_driver_passes_the_device_tests_and_exits_cleanly(rehearsal, driver):
    proc, summary, out = rehearsal
    entry = summary["drivers"][driver]
    assert entry["exit_status"] == 0 and entry["failed"] == 0, (entry.get("failures"),
                                                                 proc.stdout[-3000:])
    assert entry["passed"] >= 400              # the test_cuda_* files, all but a few
    assert entry["smoke"]["exit_status"] == 0
    assert all(step["ok"] for step in entry["smoke"]["steps"]) and len(
        entry["smoke"]["steps"]) == 7
    assert entry["device_query"]["exit_status"] == 0
    with open(os.path.join(out, "device_query-%s.log" % driver)) as f:
        text = f.read()
    # the stand-in is a device the real driver opened, built for sm_90 by NVRTC
    assert "stand-in" in text.lower() and "Driver: %s" % driver in text, text[-2000:]
    assert "CUBIN for sm_90" in text


def test_the_rehearsal_passes_every_step(rehearsal):
    proc, summary, _ = rehearsal
    assert proc.returncode == 0 and summary["ok"], proc.stdout[-3000:]
    assert summary["mode"] == "rehearse"
    assert summary["mpiexec"]["exit_status"] == 0 and summary["mpiexec"]["trained"]
    assert summary["mpiexec"]["device_line"].startswith("Device: per iteration")
    for driver in ("cuda-bindings", "pycuda"):
        assert summary["bench"][driver]["exit_status"] == 0
        assert summary["bench"][driver]["nets"]["lenet"]["host_waits_per_iter"] == 0
    names = [step["step"] for step in summary["steps"]]
    assert names[0] == "machine" and names[-1] == "bench-pycuda"
