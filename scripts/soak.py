"""Soak run: LeNet trained for many iterations, one process and two ranks under mpiexec, with the
resident memory (RSS) and the open file descriptors of every rank sampled as it runs.

The net is examples/mnist's LeNet (Data layers reading LMDBs, a test pass and a snapshot now
and then, so that readers, test nets and snapshot writes all run many times); the databases hold
synthetic 28x28 digits written by the script, so nothing is downloaded. For each rank the
report gives RSS and descriptors at the start (after warm-up), at the end and at their maximum,
the least-squares slope per 1,000 iterations, and a verdict: flat when the fitted growth over
the whole run stays under the tolerance (``--rss-tolerance-mb``, 0 descriptors); a fall (pages
handed back or reclaimed) is not growth.

    python scripts/soak.py [--iters 10000] [--ranks 1,2] [--batch 64] [--json out.json]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

ITERATION = re.compile(r"Iteration (\d+)")


def write_digits(path, count, seed):
    import numpy as np
    from poseidon_caffe.data.db import DatumWriter
    from poseidon_caffe.io import array_to_datum
    rng = np.random.default_rng(seed)
    with DatumWriter(path) as writer:
        for i in range(count):
            label = int(rng.integers(0, 10))
            # a digit-like image: a bright bar whose place depends on the label, plus noise
            image = rng.integers(0, 60, size=(1, 28, 28), dtype=np.uint8)
            image[0, 2 + 2 * label:5 + 2 * label, 4:24] = 230
            writer.put("%08d" % i, array_to_datum(image, label))


def write_job(tmp, iters, batch, snapshot_every, test_interval):
    net = open(os.path.join(ROOT, "examples", "mnist", "lenet_train_test.prototxt")).read()
    net = net.replace("examples/mnist/mnist_train_lmdb", os.path.join(tmp, "train_lmdb"))
    net = net.replace("examples/mnist/mnist_test_lmdb", os.path.join(tmp, "test_lmdb"))
    net = re.sub(r"batch_size: 64", "batch_size: %d" % batch, net)
    net = re.sub(r"batch_size: 100", "batch_size: 50", net)
    with open(os.path.join(tmp, "lenet.prototxt"), "w") as f:
        f.write(net)
    solver = os.path.join(tmp, "solver.prototxt")
    with open(solver, "w") as f:
        f.write('net: "%s"\ntest_iter: 4\ntest_interval: %d\nbase_lr: 0.01\nmomentum: 0.9\n'
                'weight_decay: 0.0005\nlr_policy: "inv"\ngamma: 0.0001\npower: 0.75\n'
                'display: 100\nmax_iter: %d\nsnapshot: %d\nsnapshot_prefix: "%s"\n'
                'random_seed: 1\n'
                % (os.path.join(tmp, "lenet.prototxt"), test_interval, iters, snapshot_every,
                   os.path.join(tmp, "lenet")))
    return solver


def _children(pid):
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError):
            continue
        if ppid == pid:
            kids.append(int(entry))
    return kids


def rank_pids(root):
    """The training processes under ``root`` (itself included): those running the cli."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        # the interpreter running the cli, not mpiexec or hydra's proxy that carry it as arguments
        if cmd[1:3] == [b"-m", b"poseidon_caffe.cli"]:
            found.append(pid)
        todo.extend(_children(pid))
    return sorted(found)


def sample(pid):
    """(RSS in MiB, open descriptors) of one process, or None once it is gone."""
    try:
        with open("/proc/%d/status" % pid) as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        fds = len(os.listdir("/proc/%d/fd" % pid))
    except (OSError, StopIteration):
        return None
    return rss / 1024.0, fds


def run_job(args, ranks, every, log_path):
    """Run ``args``; sample every rank each ``every`` seconds. {pid: [(iter, t, rss, fds)]}."""
    env = dict(os.environ, POSEIDON_NO_PROGRESS="1", PYTHONPATH=ROOT)
    log = open(log_path, "w")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            text=True)
    state = {"iter": 0}

    def follow():
        for line in proc.stdout:
            log.write(line)
            m = ITERATION.search(line)
            if m:
                state["iter"] = max(state["iter"], int(m.group(1)))

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    samples, start = {}, time.time()
    pids = []
    while proc.poll() is None:
        if len(pids) < ranks:
            pids = rank_pids(proc.pid)
        for rank, pid in enumerate(pids):
            got = sample(pid)
            if got:
                samples.setdefault(rank, []).append((state["iter"], time.time() - start) + got)
        time.sleep(every)
    reader.join(timeout=10)
    log.close()
    return proc.returncode, samples, state["iter"], time.time() - start


def fit_slope(xs, ys):
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def summarize(samples, warmup_iters, rss_tolerance):
    """Per rank: start/end/max/slope of RSS and descriptors after warm-up, and a verdict."""
    out = {}
    for rank, rows in sorted(samples.items()):
        steady = [r for r in rows if r[0] >= warmup_iters] or rows
        iters = [r[0] for r in steady]
        span = max(iters) - min(iters)
        report = {"samples": len(rows)}
        for key, col, tol in (("rss_mib", 2, rss_tolerance), ("fds", 3, 0.5)):
            values = [r[col] for r in steady]
            slope = fit_slope(iters, values)
            growth = slope * span
            report[key] = {"start": round(values[0], 1), "end": round(values[-1], 1),
                           "max": round(max(values), 1),
                           "first_sample": round(rows[0][col], 1),
                           "slope_per_1000_iters": round(slope * 1000, 3),
                           "fitted_growth": round(growth, 2),
                           # memory handed back (RSS falling) is no leak: only growth counts
                           "flat": growth <= tol}
        out[rank] = report
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=10000)
    parser.add_argument("--ranks", default="1,2", help="rank counts to run, e.g. 1,2")
    parser.add_argument("--batch", type=int, default=64, help="training batch per rank")
    parser.add_argument("--every", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--warmup", type=float, default=0.05,
                        help="share of the iterations ignored before fitting (allocator warm-up)")
    parser.add_argument("--rss-tolerance-mb", type=float, default=8.0,
                        help="largest fitted RSS growth over the run still called flat")
    parser.add_argument("--keep", default="", help="folder for the logs and databases "
                        "(default: a temporary one)")
    parser.add_argument("--json", default="", help="write the figures here too")
    a = parser.parse_args()
    tmp = a.keep or tempfile.mkdtemp(prefix="soak.")
    os.makedirs(tmp, exist_ok=True)
    if not os.path.exists(os.path.join(tmp, "train_lmdb", "data.mdb")):
        write_digits(os.path.join(tmp, "train_lmdb"), 2000, 1)
        write_digits(os.path.join(tmp, "test_lmdb"), 200, 2)
    solver = write_job(tmp, a.iters, a.batch, max(a.iters // 5, 1), max(a.iters // 10, 1))
    py = sys.executable
    mpiexec = os.path.join(os.path.dirname(py), "mpiexec")
    results = {}
    for ranks in [int(r) for r in a.ranks.split(",") if r.strip()]:
        train = [py, "-m", "poseidon_caffe.cli", "train", "-solver=%s" % solver]
        if ranks == 1:
            args = train
        else:
            args = [mpiexec, "-n", str(ranks)] + train + ["-ranks_per_host=1"]
        log_path = os.path.join(tmp, "soak_%dranks.log" % ranks)
        print("running %d rank(s), %d iterations (log: %s)" % (ranks, a.iters, log_path),
              flush=True)
        rc, samples, reached, seconds = run_job(args, ranks, a.every, log_path)
        summary = summarize(samples, a.warmup * a.iters, a.rss_tolerance_mb)
        results[ranks] = {"rc": rc, "iterations": reached, "seconds": round(seconds, 1),
                          "ranks": summary,
                          "samples": {rank: [[it, round(t, 1), round(rss, 2), fds]
                                             for it, t, rss, fds in rows]
                                      for rank, rows in samples.items()}}
        print("%d rank(s): rc %d, %d iterations in %.0f s" % (ranks, rc, reached, seconds))
        for rank, rep in summary.items():
            for key, unit in (("rss_mib", "MiB"), ("fds", "fds")):
                r = rep[key]
                print("  rank %d %-7s start %8.1f  end %8.1f  max %8.1f  slope %+.3f %s/1000 it"
                      "  -> %s" % (rank, key, r["start"], r["end"], r["max"],
                                   r["slope_per_1000_iters"], unit,
                                   "flat" if r["flat"] else "GROWS"), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(results, f, indent=1)
    ok = all(r["rc"] == 0 and all(rep[k]["flat"] for rep in r["ranks"].values()
                                  for k in ("rss_mib", "fds")) for r in results.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
