#!/usr/bin/env python
"""Write CIFAR-10's standard binary batches as the LMDBs examples/cifar10 names.

    python scripts/create_cifar10.py DATA_DIR [OUTPUT_DIR]

DATA_DIR is the unpacked cifar-10-binary.tar.gz (cifar-10-batches-bin): data_batch_1.bin ...
data_batch_5.bin and test_batch.bin, each 10,000 records of one label byte and 3,072 pixel
bytes (the red, green and blue 32x32 planes). OUTPUT_DIR (default examples/cifar10) receives
cifar10_train_lmdb (50,000) and cifar10_test_lmdb (10,000) in Caffe's convert_cifar_data layout:
Datum 3 x 32 x 32 holding the record's pixel bytes as they are, keys %05d.
"""
import os
import sys

import numpy as np

from poseidon_caffe import log
from poseidon_caffe.data.db import DataError, DatumWriter
from poseidon_caffe.proto import caffe_pb2

RECORD = 1 + 3 * 32 * 32
PER_BATCH = 10000


def read_batch(path):
    if not os.path.isfile(path):
        raise DataError("CIFAR-10 batch %s not found" % path)
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % RECORD:
        raise DataError("%s is not a CIFAR-10 binary batch: %d bytes is not a whole number of "
                        "%d-byte records" % (path, raw.size, RECORD))
    records = raw.reshape(-1, RECORD)
    return records[:, 1:], records[:, 0]


def write_db(path, batch_paths):
    with DatumWriter(path) as writer:
        for file_id, batch_path in enumerate(batch_paths):
            pixels, labels = read_batch(batch_path)
            for item, (image, label) in enumerate(zip(pixels, labels)):
                datum = caffe_pb2.Datum(channels=3, height=32, width=32, data=image.tobytes(),
                                        label=int(label))
                writer.put("%05d" % (file_id * PER_BATCH + item), datum)
        count = writer.count
    log.info("Wrote %d images to %s", count, path)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write(__doc__)
        return 1
    directory = argv[0]
    output = argv[1] if len(argv) > 1 else os.path.join("examples", "cifar10")
    os.makedirs(output, exist_ok=True)
    try:
        log.info("Writing Training data")
        write_db(os.path.join(output, "cifar10_train_lmdb"),
                 [os.path.join(directory, "data_batch_%d.bin" % i) for i in range(1, 6)])
        log.info("Writing Testing data")
        write_db(os.path.join(output, "cifar10_test_lmdb"),
                 [os.path.join(directory, "test_batch.bin")])
    except DataError as exc:
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
