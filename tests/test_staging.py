"""Temporaries beside a target: a writer killed with SIGKILL leaves one, the next write to the
same target removes it, and a temporary that a running writer still owns is never touched."""
import os
import signal
import subprocess
import sys
import time

import lmdb
import pytest

from poseidon_caffe import io, staging
from poseidon_caffe.data.db import DatumWriter
from poseidon_caffe.proto import caffe_pb2

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# a writer that stops half way, holding its temporary open, until it is killed
SLOW_FILE_WRITER = """
import sys, time
from poseidon_caffe import io
def chunks():
    yield b"half" * 1000
    print("writing", flush=True)
    time.sleep(120)
    yield b"never"
io.atomic_write(sys.argv[1], chunks())
"""

SLOW_DB_WRITER = """
import sys, time
from poseidon_caffe.data.db import DatumWriter
from poseidon_caffe.proto import caffe_pb2
writer = DatumWriter(sys.argv[1], commit_every=1, replace=True)
for i in range(5):
    writer.put("%03d" % i, caffe_pb2.Datum(channels=1, height=1, width=1, data=b"z", label=i))
print("writing", flush=True)
time.sleep(120)
"""


def start_writer(source, target):
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.Popen([sys.executable, "-c", source, str(target)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line == "writing\n", proc.stderr.read()
    return proc


def kill(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    proc.stderr.close()


def hidden(directory):
    return sorted(n for n in os.listdir(directory) if n.startswith("."))


def test_killed_file_write_is_cleaned_by_the_next_write_but_a_live_one_is_kept(tmp_path):
    target = tmp_path / "net.caffemodel"
    target.write_bytes(b"old")
    proc = start_writer(SLOW_FILE_WRITER, target)
    try:
        (left,) = hidden(tmp_path)
        assert left.startswith(".net.caffemodel.p%d-" % proc.pid) and left.endswith(".tmp")
        # a second writer while the first still runs: the first one's temporary stays
        io.atomic_write(str(target), b"second")
        assert hidden(tmp_path) == [left]
        assert target.read_bytes() == b"second"
    finally:
        kill(proc)
    assert hidden(tmp_path) == [left]              # SIGKILL left it behind
    assert target.read_bytes() == b"second"
    io.atomic_write(str(target), b"third")
    assert hidden(tmp_path) == []
    assert target.read_bytes() == b"third"


def read_labels(path):
    env = lmdb.open(str(path), readonly=True, lock=False)
    with env.begin() as txn:
        labels = [caffe_pb2.Datum.FromString(v).label for _, v in txn.cursor()]
    env.close()
    return labels


def write_db(path, labels, replace=False):
    with DatumWriter(str(path), replace=replace) as writer:
        for i, label in enumerate(labels):
            writer.put("%03d" % i, caffe_pb2.Datum(channels=1, height=1, width=1, data=b"a",
                                                   label=label))


def test_killed_database_write_leaves_the_old_one_and_is_cleaned_by_the_next(tmp_path):
    target = tmp_path / "train_lmdb"
    write_db(target, [7, 8])
    proc = start_writer(SLOW_DB_WRITER, target)
    (left,) = hidden(tmp_path)
    assert left.startswith(".train_lmdb.p%d-" % proc.pid)
    assert os.path.isfile(tmp_path / left / "data.mdb")
    kill(proc)
    assert read_labels(target) == [7, 8]           # the old database is whole
    write_db(target, [1, 2, 3], replace=True)
    assert hidden(tmp_path) == []
    assert read_labels(target) == [1, 2, 3]


def make_temp(directory, target, middle, age=0.0):
    path = directory / (".%s.%s.tmp" % (target, middle))
    path.write_bytes(b"partial")
    if age:
        past = time.time() - age
        os.utime(path, (past, past))
    return path.name


def test_which_temporaries_count_as_stale(tmp_path):
    host = staging._host()
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True)
    dead_pid = int(done.stdout)
    names = {
        "dead writer": make_temp(tmp_path, "m", "p%d-00ff-%s" % (dead_pid, host)),
        # this process, but not one of its live temporaries: a killed writer's reused id
        "own id, not live": make_temp(tmp_path, "m", "p%d-0a0b-%s" % (os.getpid(), host)),
        "old foreign host": make_temp(tmp_path, "m", "p1-0c0d-elsewhere", age=7200),
        "old mkstemp name": make_temp(tmp_path, "m", "k2j_x9aq", age=7200),
    }
    kept = {
        "running writer": make_temp(tmp_path, "m", "p%d-0e0f-%s" % (os.getppid(), host)),
        "recent foreign host": make_temp(tmp_path, "m", "p1-1a1b-elsewhere"),
        "recent mkstemp name": make_temp(tmp_path, "m", "abcdefgh"),
        "another target's": make_temp(tmp_path, "m.h5", "p%d-2a2b-%s" % (dead_pid, host)),
    }
    live = staging.temp_path(tmp_path / "m")
    open(live, "wb").close()
    (tmp_path / ".m.settings").write_text("not a temporary")
    (tmp_path / "m").write_text("the target")
    try:
        removed = staging.remove_stale(tmp_path / "m")
        assert sorted(os.path.basename(p) for p in removed) == sorted(names.values())
        assert sorted(os.listdir(tmp_path)) == sorted(
            list(kept.values()) + [os.path.basename(live), ".m.settings", "m"])
    finally:
        staging.discard(live)


def test_a_reused_process_id_started_after_the_temporary_does_not_keep_it(tmp_path):
    if staging._process_start(os.getpid()) is None:
        pytest.skip("no /proc here to tell when a process started")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        name = make_temp(tmp_path, "s", "p%d-3a3b-%s" % (sleeper.pid, staging._host()),
                         age=600)
        # this test's parent process was running before its temporary was written
        running = make_temp(tmp_path, "s", "p%d-3c3d-%s" % (os.getppid(), staging._host()))
        assert [os.path.basename(p) for p in staging.remove_stale(tmp_path / "s")] == [name]
        assert os.listdir(tmp_path) == [running]
    finally:
        sleeper.kill()
        sleeper.wait()
