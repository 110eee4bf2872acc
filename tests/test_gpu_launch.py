"""One rank per GPU, on the emulated device: -gpu's list read by local rank under mpiexec, the
launcher's per-rank device flags, and a rank whose device fails (out of memory, a driver
error in a layer) ending the whole job in one line naming rank, host, GPU and layer."""
import os
import re
import subprocess
import sys

import pytest

from poseidon_caffe.launch import launcher
from poseidon_caffe.launch.command import build_command, gpu_available
from poseidon_caffe.tools import caffe_tool as brew

from emulated_device import needs_compiler

PY = sys.executable
MPIEXEC = os.path.join(os.path.dirname(PY), "mpiexec")
LOCAL_VARS = ("MPI_LOCALRANKID", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_RANK",
              "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE", "PMI_SIZE",
              "OMPI_COMM_WORLD_SIZE")

# no learnable parameters: every rank's forward and backward run on its device (ReLU and
# pooling kernels, force_backward) whatever the gradient exchange supports
NET = """name: "on_device"
force_backward: true
layer { name: "data" type: "DummyData" top: "data" top: "target"
  dummy_data_param { shape { dim: 8 dim: 4 dim: 8 dim: 8 } shape { dim: 8 dim: 4 dim: 4 dim: 4 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "gaussian" std: 1 } } }
layer { name: "relu" type: "ReLU" bottom: "data" top: "relu" }
layer { name: "pool" type: "Pooling" bottom: "relu" top: "pool"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "loss" type: "EuclideanLoss" bottom: "pool" bottom: "target" top: "loss" }
"""


def write_job(tmp_path, max_iter=3):
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text(
        'net: "net.prototxt"\nbase_lr: 0.01 lr_policy: "fixed" display: 1\nmax_iter: %d '
        'snapshot: 0 snapshot_prefix: "snap" random_seed: 3\n' % max_iter)
    return "solver.prototxt"


def job_env(devices=2):
    env = dict(os.environ, POSEIDON_NO_PROGRESS="1", POSEIDON_CAFFE_GPU="emulated",
               POSEIDON_CAFFE_EMULATED_DEVICES=str(devices))
    for name in ("POSEIDON_CAFFE_EMULATED_FAIL", "POSEIDON_CAFFE_EMULATED_MEMORY"):
        env.pop(name, None)
    return env


# -- -gpu's list under mpiexec ------------------------------------------------------------------
@pytest.fixture
def no_mpi_env(monkeypatch):
    for name in LOCAL_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("rank_var,size_var,world_var", [
    ("MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI_SIZE"),
    ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE")])
def test_each_rank_of_a_host_takes_its_listed_gpu(no_mpi_env, rank_var, size_var, world_var):
    no_mpi_env.setenv(world_var, "4")               # 2 hosts of 2 ranks
    no_mpi_env.setenv(size_var, "2")
    for rank, expected in ((0, 3), (1, 5)):
        no_mpi_env.setenv(rank_var, str(rank))
        assert brew._rank_device([3, 5]) == expected
    assert brew._rank_device([7]) == 7              # one id: every rank takes it (Caffe's)


def test_a_gpu_list_that_does_not_match_the_ranks_per_host_is_one_error(no_mpi_env):
    no_mpi_env.setenv("PMI_SIZE", "3")
    no_mpi_env.setenv("MPI_LOCALNRANKS", "3")
    no_mpi_env.setenv("MPI_LOCALRANKID", "2")
    with pytest.raises(brew.CommandError, match=r"^-gpu=0,1 names 2 devices but this host "
                                                r"runs 3 ranks: list one GPU id per rank"):
        brew._rank_device([0, 1])


def test_several_gpus_outside_mpiexec_stay_an_error(no_mpi_env):
    with pytest.raises(brew.CommandError, match="one process drives one device: run one rank "
                                                "per device with mpiexec"):
        brew._rank_device([0, 1])


# -- the launcher -------------------------------------------------------------------------------
def test_without_an_nvidia_driver_the_launcher_starts_cpu_workers(monkeypatch):
    from poseidon_caffe.backend.cuda import choice
    monkeypatch.delenv("POSEIDON_CAFFE_GPU", raising=False)
    monkeypatch.delenv(choice.DRIVER_ENV, raising=False)
    monkeypatch.setattr(choice, "LIBCUDA", "libcuda-that-is-not-here.so.1")
    assert not gpu_available()
    monkeypatch.setenv(choice.DRIVER_ENV, "emulated")
    assert gpu_available()


def test_the_emulated_device_counts_as_a_gpu_for_the_launcher(monkeypatch):
    monkeypatch.setenv("POSEIDON_CAFFE_GPU", "emulated")
    assert gpu_available()
    args = build_command([(0, "127.0.0.1", 9999), (1, "127.0.0.2", 9999)], [2, 0],
                                  "s.prototxt", mpiexec="mpiexec", python=PY)
    segments = " ".join(args).split(" : ")
    flags = [re.findall(r"-gpu=\S+", segment) for segment in segments]
    assert flags == [["-gpu=2"], ["-gpu=0"], ["-gpu=2"], ["-gpu=0"]]
    assert all("-ranks_per_host=2" in segment for segment in segments)


def test_run_local_devices_list_gives_one_rank_per_gpu(tmp_path, monkeypatch):
    import io
    monkeypatch.setenv("POSEIDON_CAFFE_GPU", "emulated")
    (tmp_path / "localserver").write_text("0 127.0.0.1 9999\n")
    out = io.StringIO()
    code = launcher.launch_from_settings({"solver": "s.prototxt", "devices": [1, 0]},
                                         dry_run=True, repo_root=str(tmp_path), stream=out)
    assert code == 0
    line = out.getvalue().strip().splitlines()[-1]
    assert line.count(" -n 1 ") == 2
    assert re.findall(r"-gpu=(\d+)", line) == ["1", "0"]


# -- the emulated device's injected faults ------------------------------------------------------
def test_fault_setting_is_checked(monkeypatch):
    from poseidon_caffe.backend.cuda.drivers import emulated
    from poseidon_caffe.backend.cuda.driver import DriverError
    assert emulated.parse_fault("kernel:relu_forward") == ("kernel", "relu_forward", 1)
    assert emulated.parse_fault("kernel:relu_forward:3") == ("kernel", "relu_forward", 3)
    assert emulated.parse_fault("alloc:2") == ("alloc", None, 2)
    assert emulated.parse_fault("") is None
    for bad in ("kernel:", "kernel:x:0", "alloc:many", "launch:x"):
        with pytest.raises(DriverError, match="POSEIDON_CAFFE_EMULATED_FAIL=.*expected "
                                              "kernel:NAME"):
            emulated.parse_fault(bad)
    monkeypatch.setenv("POSEIDON_CAFFE_EMULATED_FAIL", "alloc:2")
    driver = emulated.EmulatedDriver()
    driver.free(driver.alloc(16))
    with pytest.raises(DriverError, match="allocation 2 on emulated device 0 failed"):
        driver.alloc(16)
    driver.free(driver.alloc(16))                   # the third goes through


@needs_compiler
def test_an_injected_kernel_fault_names_the_layer_and_pass(tmp_path):
    solver = write_job(tmp_path)
    env = dict(job_env(1), POSEIDON_CAFFE_EMULATED_FAIL="kernel:relu_backward:2")
    proc = subprocess.run([PY, "-m", "poseidon_caffe.cli", "train", "-solver=" + solver,
                           "-gpu", "0"], cwd=str(tmp_path), env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    assert ("layer 'relu' of type ReLU failed on the device in backward: DriverError: launch 2 "
            "of kernel relu_backward on emulated device 0" in proc.stderr), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


# -- real jobs ----------------------------------------------------------------------------------
@needs_compiler
@pytest.mark.mpi
def test_mpiexec_gives_each_rank_its_own_gpu_of_the_list(tmp_path):
    solver = write_job(tmp_path)
    proc = subprocess.run([MPIEXEC, "-n", "2", PY, "-m", "poseidon_caffe.cli", "train",
                           "-solver=" + solver, "-gpu", "0,1", "-output_dir=out"],
                          cwd=str(tmp_path), env=job_env(2), capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        text = (tmp_path / "out" / ("caffe.rank%d.log" % rank)).read_text()
        assert "Worker rank %d of 2" % rank in text
        assert "This rank drives GPU %d (the emulated device)" % rank in text
        assert "drives GPU %d" % (1 - rank) not in text
    # three ids for two ranks: one line from each rank, nothing trained
    proc = subprocess.run([MPIEXEC, "-n", "2", PY, "-m", "poseidon_caffe.cli", "train",
                           "-solver=" + solver, "-gpu", "0,1,2"], cwd=str(tmp_path),
                          env=job_env(3), capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    assert "-gpu=0,1,2 names 3 devices but this host runs 2 ranks" in proc.stderr
    assert "Traceback" not in proc.stderr and "Optimization" not in proc.stderr


@needs_compiler
@pytest.mark.mpi
def test_run_local_starts_one_rank_per_listed_gpu(tmp_path, monkeypatch):
    """What a run_local.py does with devices = [1, 0]: two ranks on this host, the first on
    GPU 1 and the second on GPU 0, each saying so in its client's log folder."""
    import io
    write_job(tmp_path)
    (tmp_path / "localserver").write_text("0 127.0.0.1 9999\n")
    for name, value in job_env(2).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("POSEIDON_CAFFE_EMULATED_FAIL", raising=False)
    monkeypatch.delenv("POSEIDON_CAFFE_EMULATED_MEMORY", raising=False)
    monkeypatch.chdir(tmp_path)
    code = launcher.launch_from_settings(
        {"solver": "solver.prototxt", "devices": [1, 0], "dataset": "dev"},
        repo_root=str(tmp_path), stream=io.StringIO())
    assert code == 0
    logs = tmp_path / "output" / "caffe.dev.S0.M1.T2" / "logs.0"
    for rank, gpu in ((0, 1), (1, 0)):
        text = (logs / ("caffe.rank%d.log" % rank)).read_text()
        assert "This rank drives GPU %d (the emulated device)" % gpu in text
        assert "drives GPU %d" % (1 - gpu) not in text
        assert "Optimization Done" in text


@needs_compiler
@pytest.mark.mpi
@pytest.mark.parametrize("fault,expected", [
    # rank 1's device is too small for the net's blobs
    (("POSEIDON_CAFFE_EMULATED_MEMORY", "20000"),
     r"NetMemoryError: layer '(data|relu|pool|loss)' of type \w+: out of memory in \w+ \(out "
     r"of device memory: \d+ bytes asked"),
    # rank 1's driver fails a kernel launch during backward
    (("POSEIDON_CAFFE_EMULATED_FAIL", "kernel:relu_backward:2"),
     r"LayerDeviceError: layer 'relu' of type ReLU failed on the device in backward: "
     r"DriverError: launch 2 of kernel relu_backward on emulated device 1")])
def test_a_failing_device_on_one_rank_ends_the_job_naming_rank_host_gpu_and_layer(
        tmp_path, fault, expected):
    solver = write_job(tmp_path, max_iter=1000000)    # only the failure can end it
    rank = [PY, "-m", "poseidon_caffe.cli", "train", "-solver=" + solver, "-gpu", "0,1",
            "-output_dir=out"]
    args = [MPIEXEC, "-n", "1"] + rank + [":", "-n", "1", "-env", fault[0], fault[1]] + rank
    proc = subprocess.run(args, cwd=str(tmp_path), env=job_env(2), capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode != 0
    lines = [l for l in proc.stderr.splitlines() if l.startswith("*** ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert re.fullmatch(r"\*\*\* rank 1 on host \S+ \(pid \d+\), GPU 1 failed in training: "
                        + expected + r".*; ending the job", lines[0]), lines[0]
