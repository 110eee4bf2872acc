"""``poseidon-caffe extract_features``, Caffe's tool: its arguments checked, the device chosen,
then ``extract_features.py`` does the work.
"""
import sys

from .. import backend, gpu_mode, log
from ..data.db import DataError, backend_kind
from ..extract_features import ExtractError, extract_features
from ..io import ProtoFileError
from . import flags as flagmod

USAGE = """Run a trained net forward over its data layer and save chosen blobs, one Datum per
image, to new databases.
Usage: extract_features  pretrained_net_param  feature_extraction_proto_file
    extract_feature_blob_name1[,name2,...]  save_feature_dataset_name1[,name2,...]
    num_mini_batches  db_type  [CPU/GPU] [DEVICE_ID=0]
Several blobs go out in one pass: list their names and as many dataset names, each list
separated by ',' (no spaces). db_type is lmdb or leveldb.
"""


def _select_mode(args):
    if args and args[0] not in ("CPU", "GPU"):
        raise ExtractError("the mode must be CPU or GPU, not %r" % args[0])
    if args and args[0] == "GPU":
        text = args[1] if len(args) > 1 else "0"
        if not text.isdigit():
            raise ExtractError("DEVICE_ID must be a whole number, 0 or more, not %r" % text)
        device = int(text)
        log.info("Using GPU, device id %d", device)
        backend.set_device(device)
        gpu_mode.set_mode_gpu()
    else:
        log.info("Using CPU")
        backend.set_mode_cpu()


@flagmod.documented(USAGE)
def extract_features_main(argv):
    if any(a in ("-h", "-help", "--help") for a in argv):
        sys.stdout.write(USAGE)
        return 0
    if len(argv) < 6 or len(argv) > 8:
        sys.stderr.write("extract_features: expected 6 to 8 arguments, got %d\n%s"
                         % (len(argv), USAGE))
        return 1
    weights, net_path, blobs, dbs, batches, db_type = argv[:6]
    try:
        try:
            num_mini_batches = int(batches)
        except ValueError:
            raise ExtractError("num_mini_batches must be a whole number, not %r" % batches) \
                from None
        backend_kind(db_type)
        _select_mode(argv[6:])
        extract_features(weights, net_path, blobs.split(","), dbs.split(","), num_mini_batches,
                         db_type)
    except (ExtractError, DataError, ProtoFileError, ValueError, RuntimeError, OSError) as exc:
        log.error("extract_features: %s", exc)
        return 1
    return 0
