"""GPU mode from the user's side on the emulated device: set_mode_gpu, -gpu, solver_mode GPU,
device_query, and the one-line errors when a device or the GPU itself is missing."""
import os
import subprocess
import sys

import numpy as np
import pytest

from jobs import TINY_NET as NET
from poseidon_caffe import backend
from poseidon_caffe.proto import caffe_pb2

from emulated_device import needs_compiler

from poseidon_caffe.backend.cuda import choice

NO_NVIDIA_DRIVER = choice.nvidia_driver_missing() is not None
needs_no_gpu = pytest.mark.skipif(not NO_NVIDIA_DRIVER, reason="this machine has an NVIDIA driver")


def run(tmp_path, *args, gpu="emulated", devices=None):
    env = dict(os.environ)
    env.pop("POSEIDON_CAFFE_GPU", None)
    env.pop(choice.DRIVER_ENV, None)
    if gpu:
        env[choice.DRIVER_ENV] = gpu
    if devices:
        env["POSEIDON_CAFFE_EMULATED_DEVICES"] = str(devices)
    proc = subprocess.run([sys.executable, "-m", "poseidon_caffe.cli"] + list(args),
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=180,
                          env=env)
    return proc.returncode, proc.stderr


def setup_files(tmp_path, extra=""):
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text(
        'net: "net.prototxt" base_lr: 0.1 momentum: 0.9 lr_policy: "fixed" display: 5 '
        'max_iter: 10 snapshot: 0 snapshot_prefix: "snap" random_seed: 5 %s' % extra)


@needs_compiler
def test_device_query_prints_caffes_fields_and_says_emulated(tmp_path):
    code, err = run(tmp_path, "device_query", "-gpu", "0")
    assert code == 0, err
    for field in ("Device id: 0", "Major revision number", "Total global memory",
                  "Warp size", "Number of multiprocessors", "Kernel execution timeout"):
        assert field in err, field
    assert "Emulated" in err and "Driver: the emulated device: a test device" in err


@needs_compiler
def test_train_on_the_gpu_by_flag_or_by_solver_mode(tmp_path):
    setup_files(tmp_path, 'solver_mode: GPU device_id: 0')
    code, err = run(tmp_path, "train", "-solver=solver.prototxt")
    assert code == 0, err
    assert "Use GPU with device ID 0 (the emulated device)" in err
    assert err.count("many times slower than the CPU") == 1        # said once
    assert "Optimization Done" in err
    # the flag wins over device_id
    code, err = run(tmp_path, "train", "-solver=solver.prototxt", "-gpu", "1", devices=2)
    assert code == 0 and "Use GPU with device ID 1" in err, err


def test_gpu_all_names_every_device(monkeypatch):
    from poseidon_caffe.tools import caffe_tool as brew
    monkeypatch.setenv("POSEIDON_CAFFE_GPU", "emulated")
    monkeypatch.setenv("POSEIDON_CAFFE_EMULATED_DEVICES", "3")
    assert brew._gpus("all") == [0, 1, 2]
    assert brew._gpus("2,0") == [2, 0]
    with pytest.raises(brew.CommandError, match="no device 3,5; this host has 3 GPUs"):
        brew._gpus("0,3,5")


def test_missing_devices_are_one_line(tmp_path):
    setup_files(tmp_path)
    code, err = run(tmp_path, "train", "-solver=solver.prototxt", "-gpu", "0,3", devices=2)
    assert code != 0
    assert "no device 3; this host has 2 GPUs" in err
    assert "Traceback" not in err


@needs_no_gpu
@pytest.mark.parametrize("driver", [None, "cuda-bindings", "pycuda"])
def test_gpu_on_a_machine_without_one_says_so_and_how_else_to_train(tmp_path, driver):
    setup_files(tmp_path)
    code, err = run(tmp_path, "train", "-solver=solver.prototxt", "-gpu", "0", gpu=driver)
    lines = [line for line in err.splitlines() if "no GPU here" in line]
    assert code != 0 and len(lines) == 1 and "Traceback" not in err
    assert "-gpu=0: no GPU here: no NVIDIA driver found" in lines[0]
    assert "train on the CPU" in lines[0] and "POSEIDON_CAFFE_DRIVER=emulated" in lines[0]
    assert "pycuda" not in lines[0] and "install" not in lines[0]
    setup_files(tmp_path, 'solver_mode: GPU')           # the solver asks: a warning, the CPU
    code, err = run(tmp_path, "train", "-solver=solver.prototxt", gpu=driver)
    assert code == 0 and "no GPU here" in err and "Use CPU." in err, err


@needs_no_gpu
def test_set_mode_gpu_without_a_gpu_says_so_and_keeps_the_cpu(monkeypatch):
    monkeypatch.delenv("POSEIDON_CAFFE_GPU", raising=False)
    monkeypatch.delenv(choice.DRIVER_ENV, raising=False)
    before = backend.get_backend()
    with pytest.raises(backend.GPUUnavailable, match="no GPU here"):
        backend.set_mode_gpu()
    assert backend.mode() == "cpu" and backend.get_backend() is before


@needs_compiler
def test_pycaffe_style_gpu_mode_reads_and_writes_blobs_as_numpy(monkeypatch, tmp_path):
    import poseidon_caffe as caffe
    from poseidon_caffe.net import Net
    monkeypatch.setenv("POSEIDON_CAFFE_GPU", "emulated")
    (tmp_path / "net.prototxt").write_text(NET)
    caffe.set_mode_gpu()
    caffe.set_device(0)
    try:
        net = Net(str(tmp_path / "net.prototxt"), caffe_pb2.TEST)
        x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
        w = net.params["ip"][0].data
        net.forward()
        net.blobs["data"].data[...] = x            # after DummyData: written on the host
        net.forward(start="ip")
        assert isinstance(net.blobs["ip"].data, np.ndarray)
        np.testing.assert_allclose(net.blobs["ip"].data, x @ w.T, rtol=1e-5)
    finally:
        backend.set_mode_cpu()


@needs_compiler
def test_set_device_after_set_mode_gpu_moves_to_that_device(monkeypatch):
    monkeypatch.setenv("POSEIDON_CAFFE_GPU", "emulated")
    monkeypatch.setenv("POSEIDON_CAFFE_EMULATED_DEVICES", "2")
    try:
        backend.set_mode_gpu()
        backend.set_device(1)
        assert backend.get_backend().device == 1
        with pytest.raises(backend.GPUUnavailable, match="emulated device 2 does not exist"):
            backend.set_device(2)
    finally:
        backend.set_device(0)
        backend.set_mode_cpu()
