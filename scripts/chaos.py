"""Chaos run: a 2-rank LeNet job under mpiexec, snapshotting often, has a random rank killed
(SIGKILL) at a random moment again and again; each time it resumes from the latest complete
snapshot set. At the end every snapshot file must load and the final weights must equal those
of the same job run without interruption (resuming is exact: weights, solver history, every
rank's random state and data cursor).

    python scripts/chaos.py [--kills 20] [--iters 600] [--snapshot-every 10] [--seed 1]

A snapshot set of iteration N is complete when the model, the solver state and every rank's
random-state side file exist (each is written atomically, so a file that exists is whole).
"""
import argparse
import glob
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from soak import rank_pids, write_digits  # noqa: E402  (the soak's LeNet and its digits)

RANKS = 2
ITERATION = re.compile(r"Iteration (\d+)")


def write_solver(tmp, name, iters, every, batch):
    net = open(os.path.join(ROOT, "examples", "mnist", "lenet_train_test.prototxt")).read()
    net = net.replace("examples/mnist/mnist_train_lmdb", os.path.join(tmp, "train_lmdb"))
    net = net.replace("examples/mnist/mnist_test_lmdb", os.path.join(tmp, "test_lmdb"))
    net = net.replace("batch_size: 64", "batch_size: %d" % batch)
    net_path = os.path.join(tmp, "lenet.prototxt")
    with open(net_path, "w") as f:
        f.write(net)
    os.makedirs(os.path.join(tmp, name), exist_ok=True)
    solver = os.path.join(tmp, name + "_solver.prototxt")
    with open(solver, "w") as f:
        f.write('net: "%s"\nbase_lr: 0.01\nmomentum: 0.9\nweight_decay: 0.0005\n'
                'lr_policy: "inv"\ngamma: 0.0001\npower: 0.75\ndisplay: 5\nmax_iter: %d\n'
                'snapshot: %d\nsnapshot_prefix: "%s"\nrandom_seed: 7\n'
                % (net_path, iters, every, os.path.join(tmp, name, "lenet")))
    return solver, os.path.join(tmp, name, "lenet")


def snapshot_set(prefix, it):
    base = "%s_iter_%d" % (prefix, it)
    return [base + ".caffemodel", base + ".solverstate", base + ".rngstate"] + \
        ["%s.rank%d.rngstate" % (base, r) for r in range(1, RANKS)]


def snapshot_iters(prefix):
    found = set()
    for path in glob.glob(prefix + "_iter_*.solverstate"):
        m = re.search(r"_iter_(\d+)\.solverstate$", path)
        if m:
            found.add(int(m.group(1)))
    return sorted(found)


def latest_complete(prefix):
    for it in reversed(snapshot_iters(prefix)):
        if all(os.path.exists(p) for p in snapshot_set(prefix, it)):
            return it
    return None


def start_job(solver, resume):
    py = sys.executable
    args = [os.path.join(os.path.dirname(py), "mpiexec"), "-n", str(RANKS), py, "-m",
            "poseidon_caffe.cli", "train", "-solver=%s" % solver, "-ranks_per_host=1"]
    if resume:
        args.append("-snapshot=%s" % resume)
    env = dict(os.environ, POSEIDON_NO_PROGRESS="1", PYTHONPATH=ROOT)
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, text=True,
                            start_new_session=True)
    return proc, log


def log_text(log):
    log.flush()
    log.seek(0)
    text = log.read()
    log.seek(0, 2)
    return text


def reached(log):
    found = ITERATION.findall(log_text(log))
    return int(found[-1]) if found else None


def end_job(proc, seconds):
    """Wait for the job to end; a job still running after ``seconds`` is a hang: its process
    group (this script's own child session) is killed and the hang reported."""
    try:
        return proc.wait(timeout=seconds), False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(), True


def check_files(prefix):
    """Load every snapshot file; -> (files loaded, problems)."""
    from poseidon_caffe import io as pio
    from poseidon_caffe.solver import snapshot as snap
    loaded, problems = 0, []
    for it in snapshot_iters(prefix):
        for path in snapshot_set(prefix, it):
            if not os.path.exists(path):
                continue                       # a set cut short by a kill: its files are whole
            try:
                if path.endswith(".caffemodel"):
                    pio.read_net_weights(path)
                elif path.endswith(".solverstate"):
                    snap.read_state(path)
                else:
                    with open(path, "rb") as f:
                        json.loads(f.read().decode("utf-8"))
                loaded += 1
            except Exception as exc:          # any failure to load is what this run looks for
                problems.append("%s: %s" % (path, exc))
    return loaded, problems


def weights(path):
    from poseidon_caffe import io as pio
    return pio.read_net_weights(path)[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--iters", type=int, default=600, help="total training iterations")
    parser.add_argument("--snapshot-every", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32, help="training batch per rank")
    parser.add_argument("--max-delay", type=float, default=6.0,
                        help="longest wait (seconds) before a kill")
    parser.add_argument("--startup-share", type=float, default=0.15,
                        help="share of the kills aimed at the start-up (before the first "
                             "iteration) rather than at training")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", default="", help="working folder (default: a temporary one)")
    a = parser.parse_args()
    chance = random.Random(a.seed)
    tmp = a.keep or tempfile.mkdtemp(prefix="chaos.")
    os.makedirs(tmp, exist_ok=True)
    if not os.path.exists(os.path.join(tmp, "train_lmdb", "data.mdb")):
        write_digits(os.path.join(tmp, "train_lmdb"), 1000, 1)
        write_digits(os.path.join(tmp, "test_lmdb"), 100, 2)

    # the run that is never interrupted
    straight, straight_prefix = write_solver(tmp, "straight", a.iters, a.snapshot_every, a.batch)
    print("uninterrupted run: %d iterations on %d ranks" % (a.iters, RANKS), flush=True)
    t0 = time.time()
    proc, log = start_job(straight, None)
    rc, hung = end_job(proc, 3600)
    if rc != 0:
        sys.stderr.write(log_text(log)[-3000:])
        print("the uninterrupted run failed (rc %d)" % rc)
        return 1
    print("  done in %.0f s" % (time.time() - t0), flush=True)

    chaos, prefix = write_solver(tmp, "chaos", a.iters, a.snapshot_every, a.batch)
    kills = hangs = starts = 0
    resumed_from = []
    while True:
        it = latest_complete(prefix)
        resume = snapshot_set(prefix, it)[1] if it is not None else None
        resumed_from.append(it or 0)
        starts += 1
        proc, log = start_job(chaos, resume)
        if kills >= a.kills:
            rc, hung = end_job(proc, 3600)
            if rc != 0:
                sys.stderr.write(log_text(log)[-3000:])
                print("the final resumed run failed (rc %d)" % rc)
                return 1
            print("final run from iteration %d: finished" % (it or 0), flush=True)
            break
        # leave iterations for the kills still to come: kill at a random moment, and at the
        # latest once this run has done its share of the remaining iterations
        share = max((a.iters - (it or 0)) // (a.kills - kills + 1), 2)
        limit = (it or 0) + chance.randint(1, 2 * share)
        delay = chance.uniform(0.1, a.max_delay)
        t0 = time.time()
        if chance.random() >= a.startup_share:
            # most kills land while training: the clock starts at the first iteration
            while proc.poll() is None and reached(log) is None and time.time() - t0 < 120:
                time.sleep(0.05)
            t0 = time.time()
        while proc.poll() is None and time.time() - t0 < delay:
            now = reached(log)
            if now is not None and now >= limit:
                break
            time.sleep(0.05)
        if proc.poll() is not None:
            # the run ended before its kill (it reached max_iter): start again from its end
            print("run from iteration %d ended by itself (rc %d)" % (it or 0, proc.returncode))
            if proc.returncode != 0:
                sys.stderr.write(log_text(log)[-3000:])
                print("a resumed run failed on its own")
                return 1
            if latest_complete(prefix) == a.iters:
                break
            continue
        pids = rank_pids(proc.pid)
        victim = chance.randrange(len(pids)) if pids else None
        if victim is None:
            os.killpg(proc.pid, signal.SIGKILL)   # still starting: no rank yet, kill mpiexec
        else:
            os.kill(pids[victim], signal.SIGKILL)
        kills += 1
        rc, hung = end_job(proc, 120)
        hangs += hung
        print("kill %2d: rank %s %.1f s in (iteration %s, resumed from %d); job rc %d%s; latest "
              "complete snapshot: %s" % (kills, victim if victim is not None else "(starting)",
                                         time.time() - t0, reached(log), it or 0, rc,
                                         " after a HANG" if hung else "",
                                         latest_complete(prefix)), flush=True)

    loaded, problems = check_files(prefix)
    left_tmp = glob.glob(os.path.join(tmp, "chaos", ".*.tmp"))
    final = "%s_iter_%d.caffemodel" % (prefix, a.iters)
    same = False
    if os.path.exists(final):
        want, got = weights("%s_iter_%d.caffemodel" % (straight_prefix, a.iters)), weights(final)
        same = want.keys() == got.keys() and all(
            len(want[k]) == len(got[k]) and all((x == y).all() for x, y in zip(want[k], got[k]))
            for k in want)
    print("kills: %d, job starts: %d, hangs after a kill: %d" % (kills, starts, hangs))
    print("resumed from iterations: %s" % resumed_from)
    print("snapshot files loaded: %d, failing to load: %d" % (loaded, len(problems)))
    for p in problems:
        print("  " + p)
    print("temporary files left by killed writes: %d" % len(left_tmp))
    print("final weights equal the uninterrupted run's: %s" % ("yes" if same else "NO"))
    return 0 if same and not problems and not hangs else 1


if __name__ == "__main__":
    sys.exit(main())
