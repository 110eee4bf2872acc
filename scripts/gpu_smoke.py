"""A first-contact smoke test of one GPU driver: the device, every kernel module, cuBLAS, and
LeNet and CIFAR-10 quick on the GPU against the CPU backend.

    python scripts/gpu_smoke.py --driver cuda-bindings|pycuda|emulated [--json FILE]

Steps, each printed as PASS or FAIL (a failure does not stop the others):
1. open the device; print its device_query lines and what drives it (binding, NVRTC, cuBLAS);
2. build and load every kernel source, and one launch read back;
3. cuBLAS sgemm and sdot against numpy;
4. per net: one forward/backward on the GPU and on the CPU with the same weights and inputs
   (loss, every blob, every parameter gradient; the CPU's ReLU and MAX pooling layers take the
   GPU's inputs, tests/cpu_reference.py), then 20 SGD steps each, in turn, deciding alike
   (the weights after).
The exit status is 1 when a step failed; scripts/gpu_check.py runs it once per driver and
also checks that the process ended cleanly (an abort at exit is a failure too).
"""
import argparse
import json
import os
import sys
import tempfile
import time
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

# net: (batch, largest relative difference of blobs, of gradients, of weights after 20 steps);
# cuBLAS sums in another order than numpy, and CIFAR-10 quick's 5x5x32 sums are longer
NETS = {"lenet": (8, 1e-5, 1e-4, 1e-4), "cifar10_quick": (8, 1e-4, 1e-3, 1e-3)}
STEPS = 20


class Smoke:
    def __init__(self):
        self.results = []

    def step(self, name, fn, *args):
        start = time.time()
        try:
            detail = fn(*args)
        except Exception as exc:                        # noqa: BLE001 (reported, not raised)
            self.results.append({"step": name, "ok": False, "seconds": time.time() - start,
                                 "detail": "%s: %s" % (type(exc).__name__, exc)})
            print("FAIL %s: %s: %s" % (name, type(exc).__name__, exc), flush=True)
            traceback.print_exc()
            return None
        self.results.append({"step": name, "ok": True, "seconds": time.time() - start,
                             "detail": None if detail is None else str(detail)})
        print("PASS %s (%.2f s)%s" % (name, time.time() - start,
                                      "" if detail is None else ": %s" % (detail,)), flush=True)
        return detail


def open_device():
    from poseidon_caffe import backend
    backend.set_mode_gpu()
    device = backend.get_backend()
    for line in device.describe():
        print("   " + line)
    return "%s through %s" % (device.driver.info.name, device.driver.kind)


def load_kernels():
    from poseidon_caffe import backend
    from poseidon_caffe.backend.cuda import build, kernels
    from poseidon_caffe.backend.cuda.launch import Kernel
    device = backend.get_backend()
    count, modules = 0, 0
    for module in build.sources():
        for stub in vars(getattr(kernels, module)).values():
            if isinstance(stub, Kernel):
                device.launcher.function(stub)     # the first loads the module
                count += 1
        modules += 1
    out = device.zeros((1000,))
    device.launcher.run(kernels.math.vec_set, 1000, out.ptr, 2.5)
    assert np.all(device.to_host(out) == 2.5)
    return "%d kernels in %d modules" % (count, modules)


def blas():
    from poseidon_caffe import backend
    device = backend.get_backend()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 32), dtype=np.float32)
    b = rng.standard_normal((32, 48), dtype=np.float32)
    da, db, dc = device.to_device(a), device.to_device(b), device.empty((64, 48))
    # row-major C = A B is the column-major C^T = B^T A^T
    device.blas.sgemm("N", "N", 48, 64, 32, 1.0, db.ptr, 48, da.ptr, 32, 0.0, dc.ptr, 48)
    err = float(np.abs(device.to_host(dc) - a @ b).max())
    assert err < 1e-3, err
    x = rng.standard_normal(1000, dtype=np.float32)
    dx = device.to_device(x)                    # held: its memory goes with its last view
    dot = device.blas.sdot(1000, dx.ptr, 1, dx.ptr, 1)
    assert abs(dot - float(x @ x)) < 1e-4 * float(x @ x), (dot, float(x @ x))
    version = device.blas.version() if hasattr(device.blas, "version") else "(emulated)"
    return "sgemm max error %.1e, cuBLAS version %s" % (err, version)


def _rel(got, want):
    return float(np.abs(got - want).max()) / max(float(np.abs(want).max()), 1e-30)


def _inputs(net, seed=1):
    rng = np.random.default_rng(seed)
    net.blobs["data"].data[...] = rng.uniform(-1, 1, net.blobs["data"].shape)
    net.blobs["label"].data[...] = rng.integers(0, 10, net.blobs["label"].shape)


def _prototxt(name, folder):
    import nets
    path = os.path.join(folder, name + ".prototxt")
    with open(path, "w") as f:
        f.write(nets.ALL[name](batch=NETS[name][0])[0])
    return path


def forward_backward(name, folder):
    import cpu_reference
    from poseidon_caffe import backend, rng
    from poseidon_caffe.net import TRAIN, Net
    _, blob_tol, diff_tol, _ = NETS[name]
    path = _prototxt(name, folder)
    backend.set_mode_cpu()
    rng.set_random_seed(1)                       # the same weights each run
    cpu = Net(path, TRAIN)
    _inputs(cpu)
    backend.set_mode_gpu()
    gpu = Net(path, TRAIN)
    for layer, blobs in cpu.params.items():
        for mine, theirs in zip(gpu.params[layer], blobs):
            mine.data[...] = theirs.data
    _inputs(gpu)
    gpu_loss = gpu.forward_backward()
    backend.set_mode_cpu()
    cpu_loss = cpu_reference.deciding_as(cpu, gpu)
    blobs = max(_rel(gpu.blobs[n].data, b.data) for n, b in cpu.blobs.items())
    diffs = max(_rel(m.diff, t.diff) for n, bs in cpu.params.items()
                for m, t in zip(gpu.params[n], bs))
    assert abs(gpu_loss - cpu_loss) <= blob_tol * abs(cpu_loss), (gpu_loss, cpu_loss)
    assert blobs <= blob_tol and diffs <= diff_tol, (blobs, diffs)
    return "loss %.6f vs %.6f, blobs rel %.1e, gradients rel %.1e" % (gpu_loss, cpu_loss,
                                                                       blobs, diffs)


def sgd_steps(name, folder):
    import cpu_reference
    from poseidon_caffe import backend, io as pio
    from poseidon_caffe.solver import get_solver
    _, _, _, weight_tol = NETS[name]
    path = _prototxt(name, folder)
    text = ('net: "%s" base_lr: 0.01 momentum: 0.9 weight_decay: 0.001 lr_policy: "inv" '
            'gamma: 0.0001 power: 0.75 display: 0 max_iter: %d snapshot_after_train: false '
            'random_seed: 3 type: "SGD"' % (path, STEPS))
    solvers = {}
    for mode in ("cpu", "gpu"):
        getattr(backend, "set_mode_" + mode)()
        solvers[mode] = get_solver(pio.parse_solver_text(text, "%s solver" % name))
        _inputs(solvers[mode].net)
    seconds = cpu_reference.steps_deciding_as(solvers["cpu"], solvers["gpu"], STEPS)
    weights = {mode: {n: [b.data.copy() for b in bs] for n, bs in s.net.params.items()}
               for mode, s in solvers.items()}
    worst = max(_rel(m, t) for n, bs in weights["cpu"].items()
                for m, t in zip(weights["gpu"][n], bs))
    moved = sum(float(np.abs(b).sum()) for bs in weights["gpu"].values() for b in bs)
    assert worst <= weight_tol and moved > 0, worst
    return "weights rel %.1e after %d steps; cpu %.2f s, gpu %.2f s" % (
        worst, STEPS, seconds["cpu"], seconds["gpu"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", required=True, choices=("cuda-bindings", "pycuda",
                                                            "emulated"))
    parser.add_argument("--json", help="write the steps' results to this file")
    args = parser.parse_args(argv)
    os.environ["POSEIDON_CAFFE_DRIVER"] = args.driver
    import logging
    import poseidon_caffe.log   # noqa: F401  (sets its level on import: quieten it after)
    logging.getLogger("poseidon_caffe").setLevel(logging.WARNING)
    smoke = Smoke()
    if smoke.step("open the device", open_device) is not None:
        smoke.step("load every kernel source", load_kernels)
        smoke.step("cuBLAS sgemm and sdot against numpy", blas)
        with tempfile.TemporaryDirectory() as folder:
            for name in NETS:
                smoke.step("%s forward/backward, GPU against CPU" % name, forward_backward,
                           name, folder)
                smoke.step("%s %d SGD steps, GPU against CPU" % (name, STEPS), sgd_steps,
                           name, folder)
    from poseidon_caffe import backend
    backend.set_mode_cpu()
    failed = [r["step"] for r in smoke.results if not r["ok"]]
    print("SMOKE %s: %d passed, %d failed%s" % (args.driver, len(smoke.results) - len(failed),
                                               len(failed),
                                               (": " + "; ".join(failed)) if failed else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"driver": args.driver, "steps": smoke.results}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
