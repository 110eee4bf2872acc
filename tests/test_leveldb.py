"""LevelDB, Caffe's ``backend: LEVELDB``: databases written here with plyvel itself, record by
record under Caffe's keys, read by the Data layer; the tools writing LevelDB (read back with
plyvel); several processes reading one database; and the line a machine without plyvel gets."""
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from google.protobuf import text_format

import poseidon_caffe.layers  # noqa: F401  (registers the layer types)
from poseidon_caffe import data as data_pkg
from poseidon_caffe.blob import Blob
from poseidon_caffe.data.db import DataError, DatumDB, DatumWriter
from poseidon_caffe.layers import create_layer
from poseidon_caffe.proto import caffe_pb2

plyvel = pytest.importorskip("plyvel", reason="plyvel (the leveldb extra) is not installed")

PY = sys.executable


def write_leveldb(path, values, keys=None):
    """A LevelDB as Caffe's tools leave one: one Datum per key, written with plyvel itself."""
    db = plyvel.DB(str(path), create_if_missing=True)
    with db.write_batch() as batch:
        for i, value in enumerate(values):
            batch.put(keys[i] if keys else b"%08d" % i, value)
    db.close()
    return str(path)


def read_leveldb(path):
    db = plyvel.DB(str(path))
    try:
        return [(k, caffe_pb2.Datum.FromString(v)) for k, v in db.iterator()]
    finally:
        db.close()


def raw_datum(image, label):
    c, h, w = image.shape
    return caffe_pb2.Datum(channels=c, height=h, width=w, label=label,
                           data=image.astype(np.uint8).tobytes()).SerializeToString()


def data_layer(source, batch, backend="LEVELDB", phase=caffe_pb2.TRAIN):
    text = ('name: "d" type: "Data" top: "data" top: "label" data_param { source: "%s" '
            'batch_size: %d backend: %s }' % (source, batch, backend))
    layer = create_layer(text_format.Parse(text, caffe_pb2.LayerParameter()), phase)
    top = [Blob(), Blob()]
    layer.setup([], top)
    layer.reshape([], top)
    return layer, top


@pytest.fixture(autouse=True)
def single_worker():
    data_pkg.set_worker(0, 1)
    yield
    data_pkg.set_worker(0, 1)


@pytest.fixture
def images():
    return np.random.default_rng(5).integers(0, 256, size=(7, 3, 4, 5)).astype(np.uint8)


def test_data_layer_reads_a_leveldb_in_key_order_with_wraparound(tmp_path, images, caplog):
    # written out of order: LevelDB keeps keys sorted, and Caffe reads them so
    order = [3, 0, 6, 1, 5, 2, 4]
    src = write_leveldb(tmp_path / "train_leveldb",
                        [raw_datum(images[i], 20 + i) for i in order],
                        keys=[b"%08d" % i for i in order])
    layer, top = data_layer(src, 3)
    assert "Opened leveldb %s" % src in caplog.text
    assert top[0].shape == (3, 3, 4, 5)
    for b in range(4):                              # 12 records of 7: wraps once
        layer.forward([], top)
        idx = [(3 * b + k) % 7 for k in range(3)]
        np.testing.assert_array_equal(top[0].data, images[idx].astype(np.float32))
        np.testing.assert_array_equal(top[1].data, [20 + i for i in idx])
    layer.close()
    assert caplog.text.count("Restarting data prefetching from start.") == 1


def test_two_workers_stride_over_a_leveldb(tmp_path, images):
    src = write_leveldb(tmp_path / "db", [raw_datum(im, i) for i, im in enumerate(images)])
    labels = []
    for rank in (0, 1):
        data_pkg.set_worker(rank, 2)
        layer, top = data_layer(src, 2)
        layer.forward([], top)
        labels.append(list(top[1].data))
        layer.close()
    assert labels == [[0, 2], [1, 3]]


def test_train_and_test_nets_on_one_leveldb_share_it(tmp_path, images):
    # LevelDB refuses a second open of a database, even in the same process
    src = write_leveldb(tmp_path / "db", [raw_datum(im, i) for i, im in enumerate(images)])
    train, train_top = data_layer(src, 2)
    test, test_top = data_layer(src, 3, phase=caffe_pb2.TEST)
    train.forward([], train_top)
    test.forward([], test_top)
    np.testing.assert_array_equal(test_top[1].data, [0, 1, 2])
    train.close()
    test.forward([], test_top)
    np.testing.assert_array_equal(test_top[1].data, [3, 4, 5])
    test.close()
    plyvel.DB(src).close()                  # closed with its last reader: the lock is free


def test_backend_naming_the_other_kind_reads_what_is_there_with_a_warning(tmp_path, images,
                                                                          caplog):
    import lmdb
    path = str(tmp_path / "really_lmdb")
    env = lmdb.open(path, map_size=1 << 22)
    with env.begin(write=True) as txn:
        for i, im in enumerate(images):
            txn.put(b"%08d" % i, raw_datum(im, i))
    env.close()
    layer, top = data_layer(path, 2, backend="LEVELDB")
    layer.forward([], top)
    np.testing.assert_array_equal(top[1].data, [0, 1])
    layer.close()
    assert "data_param.backend is LEVELDB but %s is an LMDB database" % path in caplog.text


HOLD = """
import sys, time, plyvel
db = plyvel.DB(sys.argv[1])
print("held", flush=True)
time.sleep(120)
"""


def test_a_leveldb_another_process_holds_is_read_through_a_private_view(tmp_path, images):
    src = write_leveldb(tmp_path / "db", [raw_datum(im, i) for i, im in enumerate(images)])
    holder = subprocess.Popen([PY, "-c", HOLD, src], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(plyvel.IOError, match="lock"):
            plyvel.DB(src)                  # what a second rank on the host would meet
        layer, top = data_layer(src, 4)
        views = [n for n in os.listdir(tmp_path) if n.startswith(".db.p%d-" % os.getpid())]
        assert len(views) == 1
        # the view's tables are the database's own files, linked, not copied
        tables = [n for n in os.listdir(src) if n.endswith((".ldb", ".sst"))]
        for name in tables:
            assert os.stat(os.path.join(src, name)).st_nlink == 2
        layer.forward([], top)
        layer.forward([], top)
        np.testing.assert_array_equal(top[1].data, [4, 5, 6, 0])
        layer.close()
        assert sorted(os.listdir(tmp_path)) == ["db"]
    finally:
        holder.kill()
        holder.wait()
    assert read_leveldb(src)[2][1].label == 2   # the database itself is as it was


def test_a_view_torn_by_the_holders_own_open_is_made_again(tmp_path, images, monkeypatch):
    """The holder opening the database as a reader copies it rewrites its log and MANIFEST:
    a file listed is gone when copied. That view is discarded and made again (the reader gets
    the records, no view left behind); a view that cannot be made at all is one line naming
    the database."""
    from poseidon_caffe.data import leveldb_store
    src = write_leveldb(tmp_path / "db", [raw_datum(im, i) for i, im in enumerate(images)])
    held = plyvel.DB(src)
    real_copy = leveldb_store.shutil.copy2
    torn = []

    def copy_torn(source, target, times=1):
        if len(torn) < times:
            torn.append(source)
            raise FileNotFoundError(2, "No such file or directory", source)
        return real_copy(source, target)
    monkeypatch.setattr(leveldb_store.shutil, "copy2", copy_torn)
    try:
        database = DatumDB(src)
        assert database.first_datum().label == 0 and len(torn) == 1
        database.close()
        assert os.listdir(tmp_path) == ["db"]
        torn.clear()
        monkeypatch.setattr(leveldb_store.shutil, "copy2",
                            lambda source, target: copy_torn(source, target, times=1000))
        with pytest.raises(DataError, match="private view of it beside it could not be made"):
            DatumDB(src)
        assert os.listdir(tmp_path) == ["db"]
    finally:
        held.close()


READ_AND_WAIT = """
import sys, time
from poseidon_caffe.data.db import DatumDB
db = DatumDB(sys.argv[1])
print(db.first_datum().label, flush=True)
time.sleep(120)
"""


def test_a_view_a_killed_reader_left_is_removed_by_the_next(tmp_path, images):
    src = write_leveldb(tmp_path / "db", [raw_datum(im, i) for i, im in enumerate(images)])
    held = plyvel.DB(src)
    reader = subprocess.Popen([PY, "-c", READ_AND_WAIT, src], stdout=subprocess.PIPE, text=True)
    assert reader.stdout.readline().strip() == "0"
    reader.send_signal(signal.SIGKILL)
    reader.wait()
    held.close()
    assert len(os.listdir(tmp_path)) == 2               # the database and the killed view
    database = DatumDB(src)
    assert database.first_datum().label == 0
    database.close()
    assert os.listdir(tmp_path) == ["db"]


def test_writer_puts_records_in_place_only_when_complete(tmp_path, images):
    path = str(tmp_path / "out_leveldb")
    with pytest.raises(RuntimeError):
        with DatumWriter(path, commit_every=2, backend="leveldb") as writer:
            for i, im in enumerate(images):
                writer.put("%08d" % i, raw_datum(im, i))
            raise RuntimeError("interrupted")
    assert os.listdir(tmp_path) == []
    with DatumWriter(path, commit_every=2, backend="leveldb") as writer:
        for i, im in enumerate(images):
            writer.put("%08d" % i, raw_datum(im, i))
    items = read_leveldb(path)
    assert [k for k, _ in items] == [b"%08d" % i for i in range(7)]
    assert [d.label for _, d in items] == list(range(7))
    with pytest.raises(DataError, match="LevelDB database .*out_leveldb.* already exists"):
        DatumWriter(path, backend="leveldb")
    # replacing swaps the whole database
    with DatumWriter(path, replace=True, backend="leveldb") as writer:
        writer.put("a", raw_datum(images[0], 99))
    assert [(k, d.label) for k, d in read_leveldb(path)] == [(b"a", 99)]
    assert os.listdir(tmp_path) == ["out_leveldb"]


def test_damaged_leveldb_is_one_line_naming_it(tmp_path, images):
    src = write_leveldb(tmp_path / "db", [raw_datum(im, i) for i, im in enumerate(images)])
    db = plyvel.DB(src)
    db.compact_range()                              # the records into a table file
    db.close()
    table = next(n for n in os.listdir(src) if n.endswith((".ldb", ".sst")))
    with open(os.path.join(src, table), "r+b") as f:
        f.truncate(40)
    with pytest.raises(DataError, match="LevelDB database .*db.*(damaged|cannot open)"):
        database = DatumDB(src)
        try:
            list(database.iter_items())
        finally:
            database.close()


def run_cli(args, env=None):
    return subprocess.run([PY, "-m", "poseidon_caffe.cli"] + args, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, **(env or {})))


@pytest.fixture
def image_list(tmp_path, images):
    from PIL import Image
    root = tmp_path / "images"
    root.mkdir()
    lines = []
    for i, im in enumerate(images):
        Image.fromarray(im.transpose(1, 2, 0)).save(root / ("%d.png" % i))
        lines.append("%d.png %d\n" % (i, i % 3))
    (tmp_path / "list.txt").write_text("".join(lines))
    return str(root) + "/", str(tmp_path / "list.txt")


def test_convert_imageset_backend_leveldb_and_compute_image_mean(tmp_path, images, image_list):
    root, listfile = image_list
    out = str(tmp_path / "conv_leveldb")
    proc = run_cli(["convert_imageset", "-backend", "leveldb", root, listfile, out])
    assert proc.returncode == 0, proc.stderr
    items = read_leveldb(out)
    assert [k for k, _ in items] == [b"%08d_%d.png" % (i, i) for i in range(7)]
    for i, (_, datum) in enumerate(items):
        # the PNG held RGB; a Datum holds BGR, channels first
        chw = np.frombuffer(datum.data, np.uint8).reshape(3, 4, 5)
        np.testing.assert_array_equal(chw, images[i][::-1])
        assert datum.label == i % 3
    mean = str(tmp_path / "mean.binaryproto")
    proc = run_cli(["compute_image_mean", "-backend", "leveldb", out, mean])
    assert proc.returncode == 0, proc.stderr
    from poseidon_caffe.io import read_blobproto
    blob = read_blobproto(mean)
    np.testing.assert_allclose(np.asarray(blob.data).reshape(3, 4, 5),
                               images[:, ::-1].astype(np.float64).mean(axis=0), rtol=1e-6)


def test_make_partitions_of_a_leveldb_writes_leveldbs(tmp_path, images):
    from poseidon_caffe.data.datasets import make_partitions
    src = write_leveldb(tmp_path / "src", [raw_datum(im, i) for i, im in enumerate(images)])
    assert make_partitions(src, 2) == [4, 3]
    assert [d.label for _, d in read_leveldb(src + "_1")] == [1, 3, 5]


def test_without_plyvel_one_line_says_what_to_install(tmp_path, images):
    src = write_leveldb(tmp_path / "db", [raw_datum(im, i) for i, im in enumerate(images)])
    code = ("import sys; sys.modules['plyvel'] = None\n"
            "from poseidon_caffe.cli import main\n"
            "sys.exit(main(['compute_image_mean', sys.argv[1]]))")
    proc = subprocess.run([PY, "-c", code, src], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "needs plyvel: pip install 'poseidon-caffe[leveldb]'" in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.mpi
def test_two_ranks_on_one_leveldb_equal_one_worker_of_twice_the_batch(tmp_path):
    """Two ranks of one host read one LevelDB (one through a private view) and end with the
    weights one worker of twice the batch reaches over the same records in an LMDB."""
    import lmdb
    from jobs import write_lenet_job
    from poseidon_caffe.data.mnist_embedded import ensure_mnist_lmdbs
    from poseidon_caffe.io import read_net_weights
    train_db, test_db = ensure_mnist_lmdbs(str(tmp_path / "digits"))
    leveldbs = []
    for path in (train_db, test_db):
        env = lmdb.open(path, readonly=True, lock=False)
        with env.begin() as txn:
            items = list(txn.cursor())
        env.close()
        leveldbs.append(write_leveldb(path + "_leveldb", [v for _, v in items],
                                      keys=[k for k, _ in items]))
    env = dict(os.environ, POSEIDON_NO_PROGRESS="1")
    one = write_lenet_job(tmp_path, "one", 16, train_db, test_db)
    proc = subprocess.run([PY, "-m", "poseidon_caffe.cli", "train", "-solver=%s" % one],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    two = write_lenet_job(tmp_path, "two", 8, *leveldbs)
    net = tmp_path / "two.prototxt"
    net.write_text(net.read_text().replace("backend: LMDB", "backend: LEVELDB"))
    mpiexec = os.path.join(os.path.dirname(PY), "mpiexec")
    proc = subprocess.run([mpiexec, "-n", "2", PY, "-m", "poseidon_caffe.cli", "train",
                           "-solver=%s" % two], capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Opened leveldb %s" % leveldbs[0] in proc.stderr
    _, single = read_net_weights(str(tmp_path / "one_iter_4.caffemodel"))
    _, joint = read_net_weights(str(tmp_path / "two_iter_4.caffemodel"))
    for layer in ("conv1", "conv2", "ip1", "ip2"):
        for a, b in zip(single[layer], joint[layer]):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=2e-6, err_msg=layer)
    assert not [n for n in os.listdir(tmp_path / "digits") if n.endswith(".tmp")]


def _tables(path):
    return {int(n.split(".")[0]) for n in os.listdir(path) if n.endswith((".ldb", ".sst"))}


def _compacted_leveldb(path):
    """A LevelDB whose MANIFEST has added and then deleted tables (small write buffers, then a
    compaction); returns it and the tables it had before the compaction."""
    db = plyvel.DB(str(path), create_if_missing=True, write_buffer_size=16 << 10)
    rng = np.random.default_rng(3)
    for round_ in range(6):
        with db.write_batch() as batch:
            for i in range(400):
                batch.put(b"%08d" % (i * 7 + round_), rng.bytes(200))
    db.close()
    before = _tables(path)
    db = plyvel.DB(str(path), write_buffer_size=16 << 10)
    db.compact_range()
    db.close()
    return str(path), before


def test_the_view_links_the_tables_the_manifest_lists_after_compactions(tmp_path):
    from poseidon_caffe.data.leveldb_store import _live_tables
    src, before = _compacted_leveldb(tmp_path / "db")
    with open(os.path.join(src, "CURRENT")) as f:
        manifest = os.path.join(src, f.read().strip())
    tables = _tables(src)
    assert tables and before - tables       # the compaction deleted tables the edits added
    assert _live_tables(manifest) == tables  # a closed database keeps exactly its live tables


def test_a_manifest_copied_while_the_holder_appends_reads_to_its_last_whole_record(tmp_path):
    """Cut at every byte, the copy never fails to read: each cut gives the tables of some
    whole-record prefix, and the whole file the database's."""
    from poseidon_caffe.data.leveldb_store import _live_tables
    src, _ = _compacted_leveldb(tmp_path / "db")
    with open(os.path.join(src, "CURRENT")) as f:
        manifest = os.path.join(src, f.read().strip())
    with open(manifest, "rb") as f:
        data = f.read()
    cut = tmp_path / "MANIFEST-cut"
    seen = []
    for end in range(len(data) + 1):
        cut.write_bytes(data[:end])
        live = _live_tables(str(cut))
        if not seen or seen[-1] != live:
            seen.append(live)
    assert seen[0] == set() and seen[-1] == _live_tables(manifest)
    records, at = 0, 0                      # the whole records: no more distinct answers
    while at + 7 <= len(data):
        at += 7 + int.from_bytes(data[at + 4:at + 6], "little")
        records += 1
    assert len(seen) <= records + 1
