"""Caffe's extract_features tool: run a trained net forward over its data and store chosen
blobs, one Datum per item, in new LMDB databases.

    extract_features pretrained.caffemodel net.prototxt blob1[,blob2,...] db1[,db2,...] \\
        num_mini_batches lmdb [CPU|GPU] [DEVICE_ID]

Each Datum holds one item of the batch: channels, height and width from the blob's legacy
(num, channels, height, width) shape, the values as float_data.  Keys count the items from 0,
zero-padded to ten digits ("0000000000"), as Caffe's format_int(i, 10). The command is
``tools/extract_features.py``.
"""
import os
import shutil

import numpy as np

from . import log

__all__ = ["ExtractError", "extract_features", "feature_datum"]

KEY_DIGITS = 10


class ExtractError(ValueError):
    """Arguments or a net that cannot give the features asked for; the message says which."""


def feature_datum(item):
    """A Datum of one item of a feature blob (the blob without its batch axis)."""
    from .proto import caffe_pb2
    item = np.asarray(item, dtype=np.float32)
    # Caffe's legacy shape: the axes after num, padded with 1s to channels, height, width
    legacy = tuple(item.shape) + (1,) * (3 - item.ndim)
    datum = caffe_pb2.Datum()
    datum.channels, datum.height, datum.width = (int(d) for d in legacy)
    datum.float_data.extend(item.ravel().tolist())
    return datum


def _key(index):
    return "%0*d" % (KEY_DIGITS, index)


def extract_features(weights, net_path, blob_names, db_paths, num_mini_batches,
                     db_type="lmdb"):
    """Forward ``num_mini_batches`` batches of the TEST-phase net ``net_path`` (weights from
    ``weights``) and write each blob of ``blob_names`` into the new database (``db_type``
    lmdb or leveldb) at the matching path. Returns the number of items written per
    database."""
    from .data.db import DataError, DatumWriter, backend_kind
    from .net import Net
    from .proto import caffe_pb2
    from .solver.snapshot import load_weights
    if len(blob_names) != len(db_paths):
        raise ExtractError("the number of blob names (%d) and dataset names (%d) must be equal"
                           % (len(blob_names), len(db_paths)))
    backend_kind(db_type)
    if num_mini_batches < 0:
        raise ExtractError("num_mini_batches must be 0 or more, not %d" % num_mini_batches)
    for path in db_paths:
        if os.path.exists(path):
            raise ExtractError("dataset %s already exists; extract_features writes a new one "
                               "(remove it or choose another name)" % path)
    net = Net(net_path, caffe_pb2.TEST)
    load_weights(net, weights)
    for name in blob_names:
        if name not in net.blobs:
            raise ExtractError("Unknown feature blob name %s in the network %s" % (name, net_path))
        if net.blobs[name].num_axes > 4:
            raise ExtractError("blob %s has %d axes; a Datum holds at most channels x height x "
                               "width per item" % (name, net.blobs[name].num_axes))
    writers = []
    try:
        for path in db_paths:
            log.info("Opening dataset %s", path)
            writers.append(DatumWriter(path, backend=db_type.lower()))
        log.info("Extracting Features")
        counts = [0] * len(blob_names)
        for _ in range(num_mini_batches):
            net.forward_prefilled()
            for i, name in enumerate(blob_names):
                data = np.asarray(net.blobs[name].data)
                if data.ndim == 0:
                    data = data.reshape(1)
                for item in data:
                    writers[i].put(_key(counts[i]), feature_datum(item))
                    counts[i] += 1
                    if counts[i] % 1000 == 0:
                        log.info("Extracted features of %d query images for feature blob %s",
                                 counts[i], name)
        for i, writer in enumerate(writers):
            writer.close()
            log.info("Extracted features of %d query images for feature blob %s", counts[i],
                     blob_names[i])
    except BaseException:
        # the databases were created here: an interrupted run leaves none half-written
        for writer, path in zip(writers, db_paths):
            try:
                writer.__exit__(RuntimeError, None, None)      # abort, close
            except (DataError, OSError):
                pass
            shutil.rmtree(path, ignore_errors=True)
        raise
    log.info("Successfully extracted the features!")
    return counts
