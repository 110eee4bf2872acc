"""convert_imageset and compute_image_mean on generated PNG and JPEG files, through the same
entry points the command line uses, and as real subprocesses of the command."""
import os
import shutil
import subprocess
import sys

import lmdb
import numpy as np
import pytest
from PIL import Image

from poseidon_caffe.data import datasets
from poseidon_caffe.tools.datasets import (compute_image_mean_main, convert_imageset_main,
                                           make_partitions_main)
from poseidon_caffe.io import read_blobproto
from poseidon_caffe.proto import caffe_pb2


@pytest.fixture
def image_folder(tmp_path):
    """Six colour images (4 PNG, 2 JPEG) of 10x12 and a list file naming them."""
    rng = np.random.default_rng(21)
    root = tmp_path / "images"
    (root / "sub").mkdir(parents=True)
    names, arrays = [], {}
    for i in range(6):
        rgb = rng.integers(0, 256, size=(10, 12, 3)).astype(np.uint8)
        name = "sub/img%d.%s" % (i, "png" if i < 4 else "jpg")
        Image.fromarray(rgb).save(root / name, **({"quality": 95} if i >= 4 else {}))
        # what the file decodes to (JPEG is lossy): read back with the same decoder
        arrays[name] = np.asarray(Image.open(root / name).convert("RGB"))
        names.append(name)
    listfile = tmp_path / "list.txt"
    listfile.write_text("".join("%s %d\n" % (n, i % 3) for i, n in enumerate(names)))
    return str(root) + "/", str(listfile), names, arrays


def read_db(path):
    env = lmdb.open(path, readonly=True, lock=False)
    with env.begin() as txn:
        items = [(k.decode(), caffe_pb2.Datum.FromString(v)) for k, v in txn.cursor()]
    env.close()
    return items


def test_raw_colour_conversion_holds_bgr_pixels_and_labels(tmp_path, image_folder):
    root, listfile, names, arrays = image_folder
    db = str(tmp_path / "raw_lmdb")
    assert convert_imageset_main([root, listfile, db]) == 0
    items = read_db(db)
    assert [k for k, _ in items] == ["%08d_%s" % (i, n) for i, n in enumerate(names)]
    for i, (key, datum) in enumerate(items):
        assert (datum.channels, datum.height, datum.width) == (3, 10, 12)
        assert datum.label == i % 3 and not datum.encoded
        chw = np.frombuffer(datum.data, np.uint8).reshape(3, 10, 12)
        np.testing.assert_array_equal(chw, arrays[names[i]][:, :, ::-1].transpose(2, 0, 1))


def test_gray_resize_and_shuffle_flags(tmp_path, image_folder):
    root, listfile, names, arrays = image_folder
    db = str(tmp_path / "gray_lmdb")
    argv = ["-gray", "--shuffle", "-resize_width=6", "-resize_height", "5", "-check_size",
            root, listfile, db]
    assert convert_imageset_main(argv) == 0
    items = read_db(db)
    assert sorted(k.split("_", 1)[1] for k, _ in items) == sorted(names)
    for key, datum in items:
        assert (datum.channels, datum.height, datum.width) == (1, 5, 6)
        rgb = arrays[key.split("_", 1)[1]].astype(np.float64)
        luma = (rgb[..., 0] * 299 + rgb[..., 1] * 587 + rgb[..., 2] * 114) / 1000
        # 12x10 -> 6x5 is an exact halving: each pixel is the mean of a 2x2 block
        want = luma.reshape(5, 2, 6, 2).mean(axis=(1, 3))
        got = np.frombuffer(datum.data, np.uint8).reshape(5, 6)
        assert np.abs(got - want).max() <= 1.0


def test_encoded_conversion_keeps_or_reencodes_the_files(tmp_path, image_folder):
    root, listfile, names, arrays = image_folder
    db = str(tmp_path / "enc_lmdb")
    assert convert_imageset_main(["-encoded", root, listfile, db]) == 0
    for (key, datum), name in zip(read_db(db), names):
        assert datum.encoded
        with open(root + name, "rb") as f:
            assert datum.data == f.read()          # same extension, no resize: the file itself
    db2 = str(tmp_path / "png_lmdb")
    assert convert_imageset_main(["-encode_type=png", root, listfile, db2]) == 0
    for (key, datum), name in zip(read_db(db2), names):
        assert datum.encoded
        decoded = np.asarray(Image.open(__import__("io").BytesIO(datum.data)).convert("RGB"))
        np.testing.assert_array_equal(decoded, arrays[name])    # PNG is lossless


def test_list_naming_a_missing_image_is_reported_and_skipped(tmp_path, image_folder, caplog):
    root, listfile, names, arrays = image_folder
    with open(listfile, "a") as f:
        f.write("sub/ghost.png 1\n")
    db = str(tmp_path / "lmdb")
    import logging
    logger = logging.getLogger("poseidon_caffe")
    logger.addHandler(caplog.handler)
    try:
        assert convert_imageset_main([root, listfile, db]) == 0
    finally:
        logger.removeHandler(caplog.handler)
    assert "sub/ghost.png" in caplog.text and "list.txt" in caplog.text
    assert len(read_db(db)) == len(names)


def test_bad_list_line_and_unknown_backend_fail(tmp_path, image_folder):
    root, listfile, names, arrays = image_folder
    bad = tmp_path / "bad.txt"
    bad.write_text("sub/img0.png\n")
    assert convert_imageset_main([root, str(bad), str(tmp_path / "a")]) == 1
    assert convert_imageset_main(["-backend=rocksdb", root, listfile,
                                  str(tmp_path / "b")]) == 1
    assert convert_imageset_main([root, listfile]) == 1


def test_compute_image_mean_matches_the_mean_computed_here(tmp_path, image_folder):
    root, listfile, names, arrays = image_folder
    db = str(tmp_path / "raw_lmdb")
    assert convert_imageset_main([root, listfile, db]) == 0
    out = str(tmp_path / "mean.binaryproto")
    assert compute_image_mean_main([db, out]) == 0
    blob = read_blobproto(out)
    assert (blob.num, blob.channels, blob.height, blob.width) == (1, 3, 10, 12)
    stack = np.stack([arrays[n][:, :, ::-1].transpose(2, 0, 1) for n in names]).astype(np.float64)
    np.testing.assert_allclose(np.asarray(blob.data).reshape(3, 10, 12), stack.mean(axis=0),
                               rtol=1e-6)


def test_compute_image_mean_of_a_missing_database_fails(tmp_path):
    assert compute_image_mean_main([str(tmp_path / "none_lmdb"), "m.binaryproto"]) == 1


def test_command_line_subprocess(tmp_path, image_folder):
    root, listfile, names, arrays = image_folder
    db = str(tmp_path / "cli_lmdb")
    env = dict(os.environ, POSEIDON_NO_PROGRESS="1")
    done = subprocess.run([sys.executable, "-m", "poseidon_caffe.cli", "convert_imageset",
                           "--resize_width=4", "--resize_height=4", root, listfile, db],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert len(read_db(db)) == 6
    done = subprocess.run([sys.executable, "-m", "poseidon_caffe.cli", "compute_image_mean",
                           db, str(tmp_path / "m.binaryproto")],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "mean_value channel [2]" in done.stderr


SCRIPTS = os.path.join(os.path.dirname(__file__), os.pardir, "scripts")


def test_create_mnist_from_idx_files(tmp_path):
    import gzip
    import struct
    rng = np.random.default_rng(2)
    sets = {}
    for prefix, n in (("train", 5), ("t10k", 3)):
        images = rng.integers(0, 256, size=(n, 28, 28)).astype(np.uint8)
        labels = rng.integers(0, 10, size=n).astype(np.uint8)
        with gzip.open(tmp_path / ("%s-images-idx3-ubyte.gz" % prefix), "wb") as f:
            f.write(struct.pack(">iiii", 2051, n, 28, 28) + images.tobytes())
        with open(tmp_path / ("%s-labels-idx1-ubyte" % prefix), "wb") as f:
            f.write(struct.pack(">ii", 2049, n) + labels.tobytes())
        sets[prefix] = (images, labels)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, os.path.join(SCRIPTS, "create_mnist.py"),
                           str(tmp_path), str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for prefix, name in (("train", "mnist_train_lmdb"), ("t10k", "mnist_test_lmdb")):
        items = read_db(str(out / name))
        images, labels = sets[prefix]
        assert [k for k, _ in items] == ["%08d" % i for i in range(len(images))]
        for (_, datum), image, label in zip(items, images, labels):
            assert (datum.channels, datum.height, datum.width, datum.label) == (1, 28, 28, label)
            assert datum.data == image.tobytes()
    # a truncated file is named in the error
    with open(tmp_path / "t10k-labels-idx1-ubyte", "wb") as f:
        f.write(struct.pack(">ii", 2049, 3) + b"\x01")
    done = subprocess.run([sys.executable, os.path.join(SCRIPTS, "create_mnist.py"),
                           str(tmp_path), str(tmp_path / "out2")], capture_output=True, text=True)
    assert done.returncode == 1 and "t10k-labels-idx1-ubyte" in done.stderr


def test_create_cifar10_from_binary_batches(tmp_path):
    rng = np.random.default_rng(3)
    records = {}
    for name in ["data_batch_%d.bin" % i for i in range(1, 6)] + ["test_batch.bin"]:
        recs = rng.integers(0, 256, size=(2, 3073)).astype(np.uint8)
        recs[:, 0] %= 10
        recs.tofile(tmp_path / name)
        records[name] = recs
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, os.path.join(SCRIPTS, "create_cifar10.py"),
                           str(tmp_path), str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    train = read_db(str(out / "cifar10_train_lmdb"))
    assert [k for k, _ in train] == ["%05d" % (f * 10000 + i) for f in range(5) for i in range(2)]
    first = records["data_batch_1.bin"][1]
    datum = train[1][1]
    assert (datum.channels, datum.height, datum.width, datum.label) == (3, 32, 32, first[0])
    assert datum.data == first[1:].tobytes()
    assert len(read_db(str(out / "cifar10_test_lmdb"))) == 2


# -- a failed run destroys nothing ---------------------------------------------------------------
def hidden(directory):
    return [n for n in os.listdir(directory) if n.startswith(".")]


def test_convert_imageset_never_overwrites_and_writes_nothing_on_failure(tmp_path, image_folder):
    root, listfile, names, arrays = image_folder
    db = str(tmp_path / "lmdb")
    assert convert_imageset_main([root, listfile, db]) == 0
    before = read_db(db)
    # an existing database is refused before any image is read
    assert convert_imageset_main(["-gray", root, listfile, db]) == 1
    # a wrong root folder: no image can be read, and nothing is written
    other = str(tmp_path / "other_lmdb")
    with pytest.raises(datasets.DataError, match="none of the 6 images"):
        datasets.convert_imageset(str(tmp_path / "nowhere") + "/", listfile, other)
    assert not os.path.exists(other)
    assert read_db(db) == before
    assert hidden(tmp_path) == []


def test_interrupted_convert_imageset_leaves_no_database(tmp_path, image_folder, monkeypatch):
    root, listfile, names, arrays = image_folder
    real = datasets.image_to_datum
    calls = []

    def interrupted(*args):
        calls.append(args)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*args)
    monkeypatch.setattr(datasets, "image_to_datum", interrupted)
    db = str(tmp_path / "lmdb")
    with pytest.raises(KeyboardInterrupt):
        datasets.convert_imageset(root, listfile, db)
    assert len(calls) == 4
    assert not os.path.exists(db) and hidden(tmp_path) == []


def write_datums(path, shapes):
    from poseidon_caffe.data.db import DatumWriter
    with DatumWriter(path) as writer:
        for i, (c, h, w) in enumerate(shapes):
            writer.put("%03d" % i, caffe_pb2.Datum(channels=c, height=h, width=w, label=i,
                                                   data=bytes(range(c * h * w))))


def test_failed_compute_image_mean_keeps_the_old_mean_file(tmp_path):
    good, mixed = str(tmp_path / "good_lmdb"), str(tmp_path / "mixed_lmdb")
    write_datums(good, [(1, 2, 2)] * 3)
    write_datums(mixed, [(1, 2, 2), (1, 3, 3)])
    out = str(tmp_path / "mean.binaryproto")
    assert compute_image_mean_main([good, out]) == 0
    before = open(out, "rb").read()
    assert list(read_blobproto(out).data) == [0.0, 1.0, 2.0, 3.0]
    assert compute_image_mean_main([mixed, out]) == 1
    assert open(out, "rb").read() == before
    assert hidden(tmp_path) == []


def test_make_partitions_writes_all_or_nothing(tmp_path):
    source = str(tmp_path / "src_lmdb")
    write_datums(source, [(1, 1, 2)] * 5)
    # a bad record in the middle: no partition appears
    bad = str(tmp_path / "bad_lmdb")
    write_datums(bad, [(1, 1, 2)] * 2)
    env = lmdb.open(bad, map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"001x", b"not a datum")
    env.close()
    assert make_partitions_main([bad, "2"]) == 1
    assert sorted(os.listdir(tmp_path)) == ["bad_lmdb", "src_lmdb"]
    # an existing partition is refused before any other is written
    os.makedirs(tmp_path / "src_lmdb_1")
    (tmp_path / "src_lmdb_1" / "keep.txt").write_text("mine")
    assert make_partitions_main([source, "3"]) == 1
    assert sorted(os.listdir(tmp_path)) == ["bad_lmdb", "src_lmdb", "src_lmdb_1"]
    assert os.listdir(tmp_path / "src_lmdb_1") == ["keep.txt"]
    shutil.rmtree(tmp_path / "src_lmdb_1")
    assert datasets.make_partitions(source, 2) == [3, 2]
    assert [d.label for _, d in read_db(source + "_1")] == [1, 3]
    assert hidden(tmp_path) == []


def cifar_batches(directory, seed, per_batch=2):
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for name in ["data_batch_%d.bin" % i for i in range(1, 6)] + ["test_batch.bin"]:
        recs = rng.integers(0, 256, size=(per_batch, 3073)).astype(np.uint8)
        recs[:, 0] %= 10
        recs.tofile(directory / name)


def error_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("E")]


def test_create_cifar10_sh_with_a_wrong_path_keeps_the_existing_databases(tmp_path):
    repo = os.path.dirname(SCRIPTS)
    tree = tmp_path / "tree"
    (tree / "examples" / "cifar10").mkdir(parents=True)
    (tree / "scripts").mkdir()
    shutil.copy(os.path.join(repo, "examples", "cifar10", "create_cifar10.sh"),
                tree / "examples" / "cifar10")
    shutil.copy(os.path.join(SCRIPTS, "create_cifar10.py"), tree / "scripts")
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, PYTHONPATH=os.path.abspath(repo), POSEIDON_NO_PROGRESS="1",
               PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    script = str(tree / "examples" / "cifar10" / "create_cifar10.sh")
    out = tree / "examples" / "cifar10"
    cifar_batches(tmp_path / "data", 4)

    def run(data):
        return subprocess.run(["sh", script, str(data)], capture_output=True, text=True, env=env)
    done = run(tmp_path / "data")
    assert done.returncode == 0, done.stderr
    train, test = read_db(str(out / "cifar10_train_lmdb")), read_db(str(out / "cifar10_test_lmdb"))
    assert (len(train), len(test)) == (10, 2)
    mean = (out / "mean.binaryproto").read_bytes()

    done = run(tmp_path / "WRONG_PATH")
    assert done.returncode != 0
    (line,) = error_lines(done.stderr)
    assert "WRONG_PATH" in line and "not found" in line
    # a batch that is cut short, found before anything is written
    cifar_batches(tmp_path / "cut", 5)
    with open(tmp_path / "cut" / "test_batch.bin", "ab") as f:
        f.write(b"\0" * 100)
    done = run(tmp_path / "cut")
    assert done.returncode != 0
    (line,) = error_lines(done.stderr)
    assert "test_batch.bin" in line and "3073-byte records" in line
    assert read_db(str(out / "cifar10_train_lmdb")) == train
    assert read_db(str(out / "cifar10_test_lmdb")) == test
    assert (out / "mean.binaryproto").read_bytes() == mean
    assert hidden(out) == []
    # a good run replaces both
    cifar_batches(tmp_path / "data2", 6, per_batch=3)
    done = run(tmp_path / "data2")
    assert done.returncode == 0, done.stderr
    assert len(read_db(str(out / "cifar10_train_lmdb"))) == 15
    assert len(read_db(str(out / "cifar10_test_lmdb"))) == 3
    assert hidden(out) == []


def test_create_mnist_with_a_wrong_path_keeps_the_existing_databases(tmp_path):
    import struct
    out = tmp_path / "out"
    for prefix, n in (("train", 3), ("t10k", 2)):
        with open(tmp_path / ("%s-images-idx3-ubyte" % prefix), "wb") as f:
            f.write(struct.pack(">iiii", 2051, n, 2, 2) + bytes(range(4 * n)))
        with open(tmp_path / ("%s-labels-idx1-ubyte" % prefix), "wb") as f:
            f.write(struct.pack(">ii", 2049, n) + bytes(range(n)))
    script = os.path.join(SCRIPTS, "create_mnist.py")
    done = subprocess.run([sys.executable, script, str(tmp_path), str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    before = [read_db(str(out / name)) for name in ("mnist_train_lmdb", "mnist_test_lmdb")]
    assert [len(items) for items in before] == [3, 2]
    done = subprocess.run([sys.executable, script, str(tmp_path / "WRONG_PATH"), str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 1
    (line,) = error_lines(done.stderr)
    assert "WRONG_PATH" in line and "not found" in line
    # the test labels are cut short: found before the training database is replaced
    with open(tmp_path / "t10k-labels-idx1-ubyte", "wb") as f:
        f.write(struct.pack(">ii", 2049, 2) + b"\x01")
    done = subprocess.run([sys.executable, script, str(tmp_path), str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "t10k-labels-idx1-ubyte" in done.stderr
    assert [read_db(str(out / name)) for name in ("mnist_train_lmdb", "mnist_test_lmdb")] == before
    assert hidden(out) == []


def test_make_partitions_names_a_count_that_is_not_a_number(tmp_path, caplog):
    source = str(tmp_path / "src_lmdb")
    write_datums(source, [(1, 1, 2)] * 2)
    assert make_partitions_main([source, "two"]) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == ["make_partitions: NUM_PARTITIONS must be a whole number, not 'two'"]
    assert sorted(os.listdir(tmp_path)) == ["src_lmdb"]
