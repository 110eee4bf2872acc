"""Caffe's dataset tools: convert_imageset, compute_image_mean, and Poseidon's make_partitions.

Each ``*_main(argv)`` takes the arguments after the subcommand name, Caffe's flags included,
and returns the process exit code.
"""
import os
import sys

import numpy as np

from .. import flags as flagmod
from .. import log
from ..proto import caffe_pb2
from . import partition_path
from .db import DataError, DatumDB, DatumWriter, check_writable, parse_datum
from .images import datum_image, decode_image, encode_image, join_root, read_image

COMMIT_EVERY = 1000

CONVERT_FLAGS = [
    flagmod.Flag("gray", False, "When this option is on, treat images as grayscale ones"),
    flagmod.Flag("shuffle", False, "Randomly shuffle the order of images and their labels"),
    flagmod.Flag("backend", "lmdb", "The backend {lmdb} for storing the result"),
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
ROOTFOLDER) into a new LMDB of Datum records.
Usage:
    convert_imageset [FLAGS] ROOTFOLDER/ LISTFILE DB_NAME
"""


def _usage_error(usage, flags, message):
    sys.stderr.write("%s: %s\n%s\nFlags:\n%s\n" % ("poseidon-caffe", message, usage,
                                                   flagmod.usage(flags)))
    return 1


def _check_backend(name):
    if name.lower() != "lmdb":
        raise DataError("backend %r is not supported; only lmdb is" % name)


def _progress(total, label):
    from ..progress import ProgressBar
    return ProgressBar(total, label)


def image_to_datum(path, label, height, width, is_color, encoding):
    """Caffe's ReadImageToDatum: a raw C x H x W Datum, or an encoded one when ``encoding``."""
    if encoding:
        same_ext = os.path.splitext(path)[1].lower().lstrip(".") in _aliases(encoding)
        image = read_image(path, height, width, is_color)
        if same_ext and not height and not width:
            # the file itself, but only when it decodes natively to the channels asked for:
            # a colour file under -gray (or a grey one without it) is re-encoded, so that the
            # record holds the 1 or 3 channels Caffe's record holds
            with open(path, "rb") as f:
                raw = f.read()
            if decode_image(raw, None, path).shape == image.shape:
                return caffe_pb2.Datum(data=raw, label=label, encoded=True), image.shape
        return (caffe_pb2.Datum(data=encode_image(image, encoding), label=label, encoded=True),
                image.shape)
    image = read_image(path, height, width, is_color)
    h, w, c = image.shape
    datum = caffe_pb2.Datum(channels=c, height=h, width=w, label=label,
                            data=np.ascontiguousarray(image.transpose(2, 0, 1)).tobytes())
    return datum, image.shape


def _aliases(ext):
    ext = ext.lower().lstrip(".")
    return {"jpg", "jpeg"} if ext in ("jpg", "jpeg") else {ext}


def convert_imageset(root, list_file, db_name, gray=False, shuffle=False, resize_width=0,
                     resize_height=0, check_size=False, encoded=False, encode_type=""):
    """Write the images ``list_file`` names (``path label`` lines) into a new LMDB, which
    appears at ``db_name`` only once complete. Returns (records written, files skipped)."""
    from .lists import read_image_list
    lines = read_image_list(list_file, "convert_imageset")
    if shuffle:
        from ..rng import get_rng
        log.info("Shuffling data")
        order = get_rng().permutation(len(lines))
        lines = [lines[i] for i in order]
    log.info("A total of %d images.", len(lines))
    if encode_type and not encoded:
        log.info("encode_type specified, assuming encoded=true.")
        encoded = True
    written = skipped = 0
    first_shape = None
    with DatumWriter(db_name, COMMIT_EVERY) as writer, _progress(len(lines), "convert") as bar:
        for line_id, (name, label) in enumerate(lines):
            encoding = encode_type
            if encoded and not encoding:
                # guess the encoding from the file name, as Caffe does
                encoding = os.path.splitext(name)[1].lstrip(".").lower()
                if not encoding:
                    log.warning("Failed to guess the encoding of '%s'", name)
            path = join_root(root, name)
            try:
                datum, shape = image_to_datum(path, label, resize_height, resize_width,
                                              not gray, encoding if encoded else "")
            except DataError as exc:
                log.error("%s (line %d of %s); skipped", exc, line_id + 1, list_file)
                skipped += 1
                continue
            if check_size:
                if first_shape is None:
                    first_shape = shape
                elif shape != first_shape:
                    raise DataError("Incorrect data field size: image %s is %s, the first "
                                    "image was %s" % (path, "x".join(map(str, shape)),
                                                      "x".join(map(str, first_shape))))
            writer.put("%08d_%s" % (line_id, name), datum)
            written += 1
            if written % COMMIT_EVERY == 0 and not bar.enabled:
                log.info("Processed %d files.", written)
            bar.update(line_id + 1)
        if lines and not written:
            # nothing to keep: the database is not created (an existing one is not touched)
            raise DataError("none of the %d images %s lists could be read (root folder %r); "
                            "%s not written" % (len(lines), list_file, root, db_name))
    if written % COMMIT_EVERY:
        log.info("Processed %d files.", written)
    return written, skipped


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
        _check_backend(values["backend"])
        if (values["resize_width"] > 0) != (values["resize_height"] > 0):
            # Caffe resizes only when both are positive, and ignores one given alone
            log.warning("-resize_width and -resize_height take effect only together; "
                        "images are not resized")
        written, skipped = convert_imageset(
            args[0], args[1], args[2], gray=values["gray"], shuffle=values["shuffle"],
            resize_width=values["resize_width"], resize_height=values["resize_height"],
            check_size=values["check_size"], encoded=values["encoded"],
            encode_type=values["encode_type"])
    except DataError as exc:
        log.error("%s", exc)
        return 1
    if skipped:
        log.warning("%d of %d images could not be read and were skipped", skipped,
                    written + skipped)
    return 0 if written else 1


# -- compute_image_mean ------------------------------------------------------------------------

MEAN_FLAGS = [flagmod.Flag("backend", "lmdb", "The backend {lmdb} for the input database")]
MEAN_USAGE = """Average every Datum of an LMDB into one mean image (a BlobProto), written to
OUTPUT_FILE when given.
Usage:
    compute_image_mean [FLAGS] INPUT_DB [OUTPUT_FILE]
"""


def compute_image_mean(db_path):
    """C x H x W float64 mean of every Datum in ``db_path`` (encoded ones decoded natively)."""
    database = DatumDB(db_path)
    try:
        total = None
        count = 0
        with _progress(len(database), "mean") as bar:
            for key, value in database.iter_items():
                image = datum_image(parse_datum(value, db_path, key),
                                    name="record %r of %s" % (key, db_path))
                if total is None:
                    total = np.zeros(image.shape, dtype=np.float64)
                elif image.shape != total.shape:
                    raise DataError("record %r of LMDB database %s is %s, but the first record "
                                    "is %s; a mean needs images of one size"
                                    % (key.decode("ascii", "replace"), db_path,
                                       "x".join(map(str, image.shape)),
                                       "x".join(map(str, total.shape))))
                total += image
                count += 1
                if count % 10000 == 0 and not bar.enabled:
                    log.info("Processed %d files.", count)
                bar.update(count)
        if not count:
            raise DataError("LMDB database %s is empty" % db_path)
        log.info("Processed %d files.", count)
        return total / count
    finally:
        database.close()


def mean_to_blobproto(mean):
    """BlobProto the way Caffe's tool writes it: num 1, channels, height, width, float data."""
    c, h, w = mean.shape
    blob = caffe_pb2.BlobProto(num=1, channels=c, height=h, width=w)
    blob.data.extend(np.asarray(mean, dtype=np.float32).ravel().tolist())
    return blob


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
        _check_backend(values["backend"])
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
PARTITION_USAGE = """Split an LMDB into per-worker partitions SOURCE_0 ... SOURCE_{P-1}.
Record i goes to partition i % P, so worker r reading SOURCE_r sees the records it would read
from SOURCE under Caffe's striding rule.
Usage:
    make_partitions SOURCE NUM_PARTITIONS
"""


def make_partitions(source, parts):
    """Write ``<source>_<k>`` for k < parts; returns the record count of each partition.
    The partitions appear only once all are complete; none may exist beforehand."""
    if parts < 1:
        raise DataError("the number of partitions must be at least 1, not %d" % parts)
    for k in range(parts):
        check_writable(partition_path(source, k))
    database = DatumDB(source)
    counts = [0] * parts
    writers = []
    try:
        for k in range(parts):
            writers.append(DatumWriter(partition_path(source, k), COMMIT_EVERY))
        for index, (key, value) in enumerate(database.iter_items()):
            parse_datum(value, source, key)
            k = index % parts
            writers[k].put(key, value)
            counts[k] += 1
    except BaseException:
        for writer in writers:
            writer.abort()
        raise
    finally:
        database.close()
    for writer in writers:
        writer.close()
    for k, n in enumerate(counts):
        log.info("Partition %s: %d records", partition_path(source, k), n)
    return counts


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
        make_partitions(args[0], int(args[1]))
    except ValueError as exc:     # DataError, and a partition count that is not a number
        log.error("%s", exc)
        return 1
    return 0
