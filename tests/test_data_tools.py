"""convert_imageset and compute_image_mean on generated PNG and JPEG files, through the same
entry points the command line uses, and as real subprocesses of the command."""
import os
import subprocess
import sys

import lmdb
import numpy as np
import pytest
from PIL import Image

from poseidon_caffe.data import tools
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
    assert tools.convert_imageset_main([root, listfile, db]) == 0
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
    assert tools.convert_imageset_main(argv) == 0
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
    assert tools.convert_imageset_main(["-encoded", root, listfile, db]) == 0
    for (key, datum), name in zip(read_db(db), names):
        assert datum.encoded
        with open(root + name, "rb") as f:
            assert datum.data == f.read()          # same extension, no resize: the file itself
    db2 = str(tmp_path / "png_lmdb")
    assert tools.convert_imageset_main(["-encode_type=png", root, listfile, db2]) == 0
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
        assert tools.convert_imageset_main([root, listfile, db]) == 0
    finally:
        logger.removeHandler(caplog.handler)
    assert "sub/ghost.png" in caplog.text and "list.txt" in caplog.text
    assert len(read_db(db)) == len(names)


def test_bad_list_line_and_leveldb_backend_fail(tmp_path, image_folder):
    root, listfile, names, arrays = image_folder
    bad = tmp_path / "bad.txt"
    bad.write_text("sub/img0.png\n")
    assert tools.convert_imageset_main([root, str(bad), str(tmp_path / "a")]) == 1
    assert tools.convert_imageset_main(["-backend=leveldb", root, listfile,
                                        str(tmp_path / "b")]) == 1
    assert tools.convert_imageset_main([root, listfile]) == 1


def test_compute_image_mean_matches_the_mean_computed_here(tmp_path, image_folder):
    root, listfile, names, arrays = image_folder
    db = str(tmp_path / "raw_lmdb")
    assert tools.convert_imageset_main([root, listfile, db]) == 0
    out = str(tmp_path / "mean.binaryproto")
    assert tools.compute_image_mean_main([db, out]) == 0
    blob = read_blobproto(out)
    assert (blob.num, blob.channels, blob.height, blob.width) == (1, 3, 10, 12)
    stack = np.stack([arrays[n][:, :, ::-1].transpose(2, 0, 1) for n in names]).astype(np.float64)
    np.testing.assert_allclose(np.asarray(blob.data).reshape(3, 10, 12), stack.mean(axis=0),
                               rtol=1e-6)


def test_compute_image_mean_of_a_missing_database_fails(tmp_path):
    assert tools.compute_image_mean_main([str(tmp_path / "none_lmdb"), "m.binaryproto"]) == 1


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
