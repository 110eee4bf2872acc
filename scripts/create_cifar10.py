#!/usr/bin/env python
"""Write CIFAR-10's standard binary batches as the LMDBs examples/cifar10 names.

    python scripts/create_cifar10.py DATA_DIR [OUTPUT_DIR]

DATA_DIR is the unpacked cifar-10-binary.tar.gz (cifar-10-batches-bin): data_batch_1.bin ...
data_batch_5.bin and test_batch.bin, each 10,000 records of one label byte and 3,072 pixel
bytes (the red, green and blue 32x32 planes). OUTPUT_DIR (default examples/cifar10) receives
cifar10_train_lmdb (50,000) and cifar10_test_lmdb (10,000) in Caffe's convert_cifar_data layout:
Datum 3 x 32 x 32 holding the record's pixel bytes as they are, keys %05d.
Every input is checked before anything is written, and databases already there are replaced
only once both new ones are complete: a failed run leaves them as they were.
"""
import contextlib
import os
import sys

import numpy as np

from poseidon_caffe import log
from poseidon_caffe.data.db import DataError, DatumWriter
from poseidon_caffe.proto import caffe_pb2

RECORD = 1 + 3 * 32 * 32
PER_BATCH = 10000


TRAIN_BATCHES = ["data_batch_%d.bin" % i for i in range(1, 6)]
TEST_BATCHES = ["test_batch.bin"]


def check_batch(path):
    """A missing or malformed batch is an error before anything is written."""
    if not os.path.isfile(path):
        raise DataError("CIFAR-10 batch %s not found" % path)
    size = os.path.getsize(path)
    if size == 0 or size % RECORD:
        raise DataError("%s is not a CIFAR-10 binary batch: %d bytes is not a whole number of "
                        "%d-byte records" % (path, size, RECORD))


def read_batch(path):
    check_batch(path)
    records = np.fromfile(path, dtype=np.uint8).reshape(-1, RECORD)
    return records[:, 1:], records[:, 0]


def write_db(writer, batch_paths):
    for file_id, batch_path in enumerate(batch_paths):
        pixels, labels = read_batch(batch_path)
        for item, (image, label) in enumerate(zip(pixels, labels)):
            datum = caffe_pb2.Datum(channels=3, height=32, width=32, data=image.tobytes(),
                                    label=int(label))
            writer.put("%05d" % (file_id * PER_BATCH + item), datum)


def create(directory, output):
    """Both databases, replacing earlier ones only once both are complete."""
    if not os.path.isdir(directory):
        raise DataError("CIFAR-10 data directory %s not found (it should hold the unpacked "
                        "cifar-10-binary.tar.gz: data_batch_1.bin ... test_batch.bin)" % directory)
    train = [os.path.join(directory, name) for name in TRAIN_BATCHES]
    test = [os.path.join(directory, name) for name in TEST_BATCHES]
    for path in train + test:
        check_batch(path)
    os.makedirs(output, exist_ok=True)
    targets = [(os.path.join(output, "cifar10_train_lmdb"), train, "Training"),
               (os.path.join(output, "cifar10_test_lmdb"), test, "Testing")]
    with contextlib.ExitStack() as stack:
        for path, batches, what in targets:
            log.info("Writing %s data", what)
            writer = stack.enter_context(DatumWriter(path, replace=True))
            write_db(writer, batches)
            log.info("Wrote %d images to %s", writer.count, path)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "-help", "--help"):
        (sys.stdout if argv else sys.stderr).write(__doc__)
        return 0 if argv else 1
    directory = argv[0]
    output = argv[1] if len(argv) > 1 else os.path.join("examples", "cifar10")
    try:
        create(directory, output)
    except (DataError, OSError) as exc:
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
