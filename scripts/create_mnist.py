#!/usr/bin/env python
"""Write MNIST's standard idx files as the LMDBs examples/mnist names.

    python scripts/create_mnist.py DATA_DIR [OUTPUT_DIR]

DATA_DIR holds train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
t10k-labels-idx1-ubyte, each optionally gzipped (.gz). OUTPUT_DIR (default examples/mnist)
receives mnist_train_lmdb and mnist_test_lmdb in Caffe's convert_mnist_data layout: one Datum
of 1 x rows x cols raw bytes per image, keys %08d, in file order.
Every input is read and checked before anything is written, and databases already there are
replaced only once both new ones are complete: a failed run leaves them as they were.
Without the idx files, the quick start uses the embedded digits instead
(python -m poseidon_caffe.tools.mnist).
"""
import contextlib
import gzip
import os
import struct
import sys

import numpy as np

from poseidon_caffe import log
from poseidon_caffe.data.db import DataError, DatumWriter
from poseidon_caffe.proto import caffe_pb2

IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049


def _open(directory, stem):
    for name in (stem, stem + ".gz"):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path, (gzip.open(path, "rb") if name.endswith(".gz") else open(path, "rb"))
    raise DataError("MNIST file %s (or %s.gz) not found in %s" % (stem, stem, directory))


def read_idx(directory, stem, magic):
    path, f = _open(directory, stem)
    with f:
        raw = f.read()
    dims = 3 if magic == IMAGES_MAGIC else 1
    header = 4 * (1 + dims)
    if len(raw) < header or struct.unpack(">i", raw[:4])[0] != magic:
        raise DataError("%s is not an idx file of %s (magic number %d expected)"
                        % (path, "images" if dims == 3 else "labels", magic))
    shape = struct.unpack(">" + "i" * dims, raw[4:header])
    count = int(np.prod(shape))
    if len(raw) - header != count:
        raise DataError("%s is truncated: %d bytes of data for shape %s"
                        % (path, len(raw) - header, shape))
    return np.frombuffer(raw, np.uint8, offset=header).reshape(shape)


SPLITS = [("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "mnist_train_lmdb"),
          ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", "mnist_test_lmdb")]


def read_split(directory, images_stem, labels_stem):
    images = read_idx(directory, images_stem, IMAGES_MAGIC)
    labels = read_idx(directory, labels_stem, LABELS_MAGIC)
    if len(images) != len(labels):
        raise DataError("%s has %d images but %s has %d labels"
                        % (images_stem, len(images), labels_stem, len(labels)))
    return images, labels


def write_split(writer, images, labels):
    log.info("A total of %d items.", len(images))
    log.info("Rows: %d Cols: %d", images.shape[1], images.shape[2])
    for i, (image, label) in enumerate(zip(images, labels)):
        datum = caffe_pb2.Datum(channels=1, height=images.shape[1], width=images.shape[2],
                                data=image.tobytes(), label=int(label))
        writer.put("%08d" % i, datum)
    log.info("Processed %d files into %s.", len(images), writer.path)


def create(directory, output):
    """Both databases, replacing earlier ones only once both are complete."""
    if not os.path.isdir(directory):
        raise DataError("MNIST data directory %s not found (it should hold %s)"
                        % (directory, ", ".join(stem for split in SPLITS for stem in split[:2])))
    splits = [(read_split(directory, images, labels), name) for images, labels, name in SPLITS]
    os.makedirs(output, exist_ok=True)
    with contextlib.ExitStack() as stack:
        for (images, labels), name in splits:
            writer = stack.enter_context(DatumWriter(os.path.join(output, name), replace=True))
            write_split(writer, images, labels)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "-help", "--help"):
        (sys.stdout if argv else sys.stderr).write(__doc__)
        return 0 if argv else 1
    directory = argv[0]
    output = argv[1] if len(argv) > 1 else os.path.join("examples", "mnist")
    try:
        create(directory, output)
    except (DataError, OSError) as exc:
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
