"""Caffe's dataset tools: convert_imageset, compute_image_mean, and Poseidon's make_partitions.

The work, with plain arguments; the commands of those names (their flags, their exit codes)
are in ``tools/datasets.py``.
"""
import os

import numpy as np

from .. import log
from ..proto import caffe_pb2
from . import partition_path
from .db import DataError, DatumDB, DatumWriter, check_writable
from .images import datum_image, decode_image, encode_image, join_root, read_image

COMMIT_EVERY = 1000


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
                     resize_height=0, check_size=False, encoded=False, encode_type="",
                     backend="lmdb"):
    """Write the images ``list_file`` names (``path label`` lines) into a new database (LMDB,
    or LevelDB for ``backend="leveldb"``), which appears at ``db_name`` only once complete.
    Returns (records written, files skipped)."""
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
    with DatumWriter(db_name, COMMIT_EVERY, backend=backend) as writer, \
            _progress(len(lines), "convert") as bar:
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


# -- compute_image_mean ------------------------------------------------------------------------
def compute_image_mean(db_path, kind=None):
    """C x H x W float64 mean of every Datum in ``db_path`` (encoded ones decoded natively);
    ``kind`` ("LMDB", "LevelDB"), when given, is what the database must be."""
    database = DatumDB(db_path, kind)
    try:
        total = None
        count = 0
        with _progress(len(database), "mean") as bar:
            for key, value in database.iter_items():
                image = datum_image(database.parse(value, key),
                                    name="record %r of %s" % (key, db_path))
                if total is None:
                    total = np.zeros(image.shape, dtype=np.float64)
                elif image.shape != total.shape:
                    raise DataError("record %r of %s database %s is %s, but the first record "
                                    "is %s; a mean needs images of one size"
                                    % (key.decode("ascii", "replace"), database.kind, db_path,
                                       "x".join(map(str, image.shape)),
                                       "x".join(map(str, total.shape))))
                total += image
                count += 1
                if count % 10000 == 0 and not bar.enabled:
                    log.info("Processed %d files.", count)
                bar.update(count)
        if not count:
            raise DataError("%s database %s is empty" % (database.kind, db_path))
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


# -- make_partitions ---------------------------------------------------------------------------
def make_partitions(source, parts):
    """Write ``<source>_<k>`` for k < parts; returns the record count of each partition.
    The partitions appear only once all are complete; none may exist beforehand."""
    if parts < 1:
        raise DataError("the number of partitions must be at least 1, not %d" % parts)
    database = DatumDB(source)
    backend = database.kind.lower()             # the partitions are of the source's kind
    counts = [0] * parts
    writers = []
    try:
        for k in range(parts):
            check_writable(partition_path(source, k), backend=backend)
        for k in range(parts):
            writers.append(DatumWriter(partition_path(source, k), COMMIT_EVERY,
                                       backend=backend))
        for index, (key, value) in enumerate(database.iter_items()):
            database.parse(value, key)
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
