"""Damaged LMDBs end in one line naming the database, never in a bus error: a data.mdb cut
short (LMDB maps the file; a page past its end is SIGBUS), one that shrinks under a running
reader, and pages overwritten with garbage."""
import os
import shutil
import signal
import subprocess
import sys

import lmdb
import numpy as np
import pytest
from google.protobuf import text_format

import poseidon_caffe.layers  # noqa: F401  (registers the layer types)
from poseidon_caffe.blob import Blob
from poseidon_caffe.data.db import DataError, DatumDB
from poseidon_caffe.layers import create_layer
from poseidon_caffe.proto import caffe_pb2

PY = sys.executable
PAGE = 4096


def write_digits(path, count=300):
    rng = np.random.default_rng(0)
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i in range(count):
            datum = caffe_pb2.Datum(channels=1, height=28, width=28, label=i % 10,
                                    data=rng.integers(0, 256, 784).astype(np.uint8).tobytes())
            txn.put(b"%08d" % i, datum.SerializeToString())
    env.close()
    return str(path)


def cut(path, size):
    with open(os.path.join(path, "data.mdb"), "r+b") as f:
        f.truncate(size)


READ_ALL = """
import sys
from poseidon_caffe.data.db import DataError, DatumDB
for path in sys.argv[1:]:
    try:
        db = DatumDB(path)
        n = sum(1 for key, value in db.iter_items() if db.parse(value, key))
        print("read", n, flush=True)
    except DataError as exc:
        print("error", exc, flush=True)
"""


def read_all(paths):
    proc = subprocess.run([PY, "-c", READ_ALL] + list(paths), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, "died by signal %s: %s" % (-proc.returncode, proc.stderr)
    return proc.stdout.splitlines()


def test_a_data_file_cut_short_is_refused_at_open_naming_both_sizes(tmp_path):
    good = write_digits(tmp_path / "good")
    size = os.path.getsize(os.path.join(good, "data.mdb"))
    paths = []
    for pages in (size // PAGE - 1, size // PAGE // 2, 5):
        path = str(tmp_path / ("cut%d" % pages))
        shutil.copytree(good, path)
        cut(path, pages * PAGE)
        paths.append(path)
    lines = read_all([good] + paths)
    assert lines[0] == "read 300"
    for path, line in zip(paths, lines[1:]):
        assert line.startswith("error LMDB database %r is truncated" % path), line
        assert "holds %d bytes but the database records %d" % (os.path.getsize(
            os.path.join(path, "data.mdb")), size) in line


def data_layer(source, batch):
    text = ('name: "d" type: "Data" top: "data" top: "label" data_param { source: "%s" '
            'batch_size: %d backend: LMDB prefetch: 0 }' % (source, batch))
    layer = create_layer(text_format.Parse(text, caffe_pb2.LayerParameter()), caffe_pb2.TRAIN)
    top = [Blob(), Blob()]
    layer.setup([], top)
    layer.reshape([], top)
    return layer, top


def test_a_data_file_that_shrinks_under_a_reader_stops_it_before_the_next_batch(tmp_path):
    path = write_digits(tmp_path / "db")
    layer, top = data_layer(path, 10)
    layer.forward([], top)
    cut(path, 6 * PAGE)
    with pytest.raises(DataError, match="db' is truncated"):
        layer.forward([], top)
    layer.close()


def test_garbage_pages_give_one_line_naming_the_database_and_record(tmp_path):
    good = write_digits(tmp_path / "good")
    pages = os.path.getsize(os.path.join(good, "data.mdb")) // PAGE
    paths = []
    for seed in range(8):
        rng = np.random.default_rng(seed)
        path = str(tmp_path / ("bad%d" % seed))
        shutil.copytree(good, path)
        with open(os.path.join(path, "data.mdb"), "r+b") as f:
            f.seek(int(rng.integers(2, pages)) * PAGE)
            f.write(rng.integers(0, 256, PAGE).astype(np.uint8).tobytes())
        paths.append(path)
    for path, line in zip(paths, read_all(paths)):
        # a damaged tree page, or a record whose bytes are no Datum: either names the place
        assert (line.startswith("error LMDB database %r is damaged " % path)
                or line.startswith("error record ")), line
        assert path in line
        assert "after record '000" in line or "before its first" in line or "record '" in line


def test_training_on_a_truncated_database_exits_with_one_line(tmp_path):
    from jobs import write_lenet_job
    from poseidon_caffe.data.mnist_embedded import ensure_mnist_lmdbs
    train_db, test_db = ensure_mnist_lmdbs(str(tmp_path / "digits"))
    size = os.path.getsize(os.path.join(train_db, "data.mdb"))
    cut(train_db, size // 2)
    solver = write_lenet_job(tmp_path, "lenet", 64, train_db, test_db, max_iter=40)
    proc = subprocess.run([PY, "-m", "poseidon_caffe.cli", "train", "-solver=%s" % solver],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, POSEIDON_NO_PROGRESS="1"))
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert proc.returncode != -signal.SIGBUS
    errors = [line for line in proc.stderr.splitlines() if line.startswith(("E", "F"))]
    assert len(errors) == 1 and "mnist_train_lmdb' is truncated" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_bad_record_mid_training_ends_it_with_a_snapshot_of_the_work_so_far(tmp_path):
    from jobs import write_lenet_job
    from poseidon_caffe.io import read_net_weights
    train = write_digits(tmp_path / "train_lmdb", 400)
    env = lmdb.open(train, map_size=1 << 26)
    with env.begin(write=True) as txn:
        txn.put(b"%08d" % 300, b"\x07not a datum")
    env.close()
    test = write_digits(tmp_path / "test_lmdb", 20)
    solver = write_lenet_job(tmp_path, "lenet", 64, train, test, max_iter=40)
    proc = subprocess.run([PY, "-m", "poseidon_caffe.cli", "train", "-solver=%s" % solver],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, POSEIDON_NO_PROGRESS="1"))
    assert proc.returncode == 1, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith(("E", "F"))]
    assert len(errors) == 1 and "record '00000300' of LMDB database" in errors[0], proc.stderr
    # records 0..299 make iterations 0..3 (batch 64); the fifth batch reaches record 300
    assert "Iteration 4: the data could not be read; snapshotting the work so far" in proc.stderr
    _, weights = read_net_weights(str(tmp_path / "lenet_iter_4.caffemodel"))
    assert set(weights) >= {"conv1", "conv2", "ip1", "ip2"}
    assert os.path.exists(tmp_path / "lenet_iter_4.solverstate")
