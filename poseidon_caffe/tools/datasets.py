"""``convert_imageset``, ``compute_image_mean`` and ``make_partitions`` with Caffe's flags;
each ``*_main(argv)`` takes the arguments after the command's name and returns the exit code.
The work is in ``data/datasets.py``.
"""
import sys

from .. import log
from ..data.db import DataError, backend_kind
from ..data.datasets import compute_image_mean, convert_imageset, make_partitions, mean_to_blobproto
from . import flags as flagmod

# -- convert_imageset --------------------------------------------------------------------------
CONVERT_FLAGS = [
    flagmod.Flag("gray", False, "When this option is on, treat images as grayscale ones"),
    flagmod.Flag("shuffle", False, "Randomly shuffle the order of images and their labels"),
    flagmod.Flag("backend", "lmdb", "The backend {lmdb, leveldb} for storing the result"),
    flagmod.Flag("resize_width", 0, "Width images are resized to"),
    flagmod.Flag("resize_height", 0, "Height images are resized to"),
    flagmod.Flag("check_size", False, "When this option is on, check that all the datum have "
                 "the same size"),
    flagmod.Flag("encoded", False, "When this option is on, the encoded image will be save in "
                 "datum"),
    flagmod.Flag("encode_type", "", "Optional: What type should we encode the image as "
                 "('png','jpg',...)."),
]

CONVERT_USAGE = """Write the images named in LISTFILE (lines of "path label", paths relative to
ROOTFOLDER) into a new LMDB (or LevelDB, -backend leveldb) of Datum records.
Usage:
    convert_imageset [FLAGS] ROOTFOLDER/ LISTFILE DB_NAME
"""


def _usage_error(usage, flags, message):
    sys.stderr.write("%s: %s\n%s\nFlags:\n%s\n" % ("poseidon-caffe", message, usage,
                                                   flagmod.usage(flags)))
    return 1


@flagmod.documented(CONVERT_USAGE, CONVERT_FLAGS)
def convert_imageset_main(argv):
    try:
        values, args = flagmod.parse(argv, CONVERT_FLAGS)
    except flagmod.FlagError as exc:
        return _usage_error(CONVERT_USAGE, CONVERT_FLAGS, str(exc))
    if len(args) < 3:
        return _usage_error(CONVERT_USAGE, CONVERT_FLAGS, "convert_imageset needs ROOTFOLDER/ "
                            "LISTFILE DB_NAME")
    try:
        backend_kind(values["backend"])
        if (values["resize_width"] > 0) != (values["resize_height"] > 0):
            # Caffe resizes only when both are positive, and ignores one given alone
            log.warning("-resize_width and -resize_height take effect only together; "
                        "images are not resized")
        written, skipped = convert_imageset(
            args[0], args[1], args[2], gray=values["gray"], shuffle=values["shuffle"],
            resize_width=values["resize_width"], resize_height=values["resize_height"],
            check_size=values["check_size"], encoded=values["encoded"],
            encode_type=values["encode_type"], backend=values["backend"].lower())
    except DataError as exc:
        log.error("%s", exc)
        return 1
    if skipped:
        log.warning("%d of %d images could not be read and were skipped", skipped,
                    written + skipped)
    return 0 if written else 1


# -- compute_image_mean ------------------------------------------------------------------------
MEAN_FLAGS = [flagmod.Flag("backend", "lmdb", "The backend {lmdb, leveldb} for the input "
                           "database (the kind INPUT_DB holds is read either way)")]
MEAN_USAGE = """Average every Datum of an LMDB or LevelDB into one mean image (a BlobProto),
written to OUTPUT_FILE when given.
Usage:
    compute_image_mean [FLAGS] INPUT_DB [OUTPUT_FILE]
"""


@flagmod.documented(MEAN_USAGE, MEAN_FLAGS)
def compute_image_mean_main(argv):
    try:
        values, args = flagmod.parse(argv, MEAN_FLAGS)
    except flagmod.FlagError as exc:
        return _usage_error(MEAN_USAGE, MEAN_FLAGS, str(exc))
    if len(args) not in (1, 2):
        return _usage_error(MEAN_USAGE, MEAN_FLAGS, "compute_image_mean needs INPUT_DB "
                            "[OUTPUT_FILE]")
    try:
        backend_kind(values["backend"])
        mean = compute_image_mean(args[0])
        if len(args) == 2:
            from ..io import write_blobproto
            log.info("Write to %s", args[1])
            write_blobproto(mean_to_blobproto(mean), args[1])
    except DataError as exc:
        log.error("%s", exc)
        return 1
    for c in range(mean.shape[0]):
        log.info("mean_value channel [%d]: %s", c, float(mean[c].mean()))
    return 0


# -- make_partitions ---------------------------------------------------------------------------
PARTITION_FLAGS = []
PARTITION_USAGE = """Split an LMDB or LevelDB into per-worker partitions SOURCE_0 ... SOURCE_{P-1}
(of the same kind).
Record i goes to partition i % P, so worker r reading SOURCE_r sees the records it would read
from SOURCE under Caffe's striding rule.
Usage:
    make_partitions SOURCE NUM_PARTITIONS
"""


@flagmod.documented(PARTITION_USAGE, PARTITION_FLAGS)
def make_partitions_main(argv):
    try:
        _, args = flagmod.parse(argv, PARTITION_FLAGS)
    except flagmod.FlagError as exc:
        return _usage_error(PARTITION_USAGE, PARTITION_FLAGS, str(exc))
    if len(args) != 2:
        return _usage_error(PARTITION_USAGE, PARTITION_FLAGS, "make_partitions needs SOURCE "
                            "NUM_PARTITIONS")
    try:
        count = int(args[1])
    except ValueError:
        log.error("make_partitions: NUM_PARTITIONS must be a whole number, not %r", args[1])
        return 1
    try:
        make_partitions(args[0], count)
    except ValueError as exc:     # DataError
        log.error("%s", exc)
        return 1
    return 0
