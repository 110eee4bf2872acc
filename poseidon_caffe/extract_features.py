"""Caffe's extract_features tool: run a trained net forward over its data and store chosen
blobs, one Datum per item, in new LMDB databases.

    extract_features pretrained.caffemodel net.prototxt blob1[,blob2,...] db1[,db2,...] \\
        num_mini_batches lmdb [CPU|GPU] [DEVICE_ID]

Each Datum holds one item of the batch: channels, height and width from the blob's legacy
(num, channels, height, width) shape, the values as float_data.  Keys count the items from 0,
zero-padded to ten digits ("0000000000"), as Caffe's format_int(i, 10).
"""
import os
import shutil
import sys

import numpy as np

from . import log

__all__ = ["ExtractError", "extract_features", "feature_datum", "extract_features_main"]

USAGE = """This program takes in a trained network and an input data layer, and then extracts
features of the input data produced by the net.
Usage: extract_features  pretrained_net_param  feature_extraction_proto_file
    extract_feature_blob_name1[,name2,...]  save_feature_dataset_name1[,name2,...]
    num_mini_batches  db_type  [CPU/GPU] [DEVICE_ID=0]
Note: you can extract multiple features in one pass by specifying multiple feature blob names
and dataset names separated by ','. The names cannot contain white space characters and the
number of blobs and datasets must be equal.
"""

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


def extract_features(weights, net_path, blob_names, db_paths, num_mini_batches):
    """Forward ``num_mini_batches`` batches of the TEST-phase net ``net_path`` (weights from
    ``weights``) and write each blob of ``blob_names`` into the new LMDB at the matching
    path. Returns the number of items written per database."""
    from .data.db import DataError, DatumWriter
    from .net import Net
    from .proto import caffe_pb2
    from .solver.snapshot import load_weights
    if len(blob_names) != len(db_paths):
        raise ExtractError("the number of blob names (%d) and dataset names (%d) must be equal"
                           % (len(blob_names), len(db_paths)))
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
            writers.append(DatumWriter(path))
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


def _select_mode(args):
    from . import backend
    if args and args[0] not in ("CPU", "GPU"):
        raise ExtractError("the mode must be CPU or GPU, not %r" % args[0])
    if args and args[0] == "GPU":
        text = args[1] if len(args) > 1 else "0"
        if not text.isdigit():
            raise ExtractError("DEVICE_ID must be a whole number, 0 or more, not %r" % text)
        device = int(text)
        log.info("Using GPU, device id %d", device)
        backend.set_device(device)
        backend.set_mode_gpu()
    else:
        log.info("Using CPU")
        backend.set_mode_cpu()


def extract_features_main(argv):
    if any(a in ("-h", "-help", "--help") for a in argv):
        sys.stdout.write(USAGE)
        return 0
    if len(argv) < 6 or len(argv) > 8:
        sys.stderr.write("extract_features: expected 6 to 8 arguments, got %d\n%s"
                         % (len(argv), USAGE))
        return 1
    from .data.db import DataError
    from .io import ProtoFileError
    weights, net_path, blobs, dbs, batches, db_type = argv[:6]
    try:
        if db_type.lower() != "lmdb":
            raise ExtractError("db_type %r is not supported; only lmdb is" % db_type)
        try:
            num_mini_batches = int(batches)
        except ValueError:
            raise ExtractError("num_mini_batches must be a whole number, not %r" % batches) \
                from None
        _select_mode(argv[6:])
        extract_features(weights, net_path, blobs.split(","), dbs.split(","), num_mini_batches)
    except (ExtractError, DataError, ProtoFileError, ValueError, RuntimeError, OSError) as exc:
        log.error("extract_features: %s", exc)
        return 1
    return 0
