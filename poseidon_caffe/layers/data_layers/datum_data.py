"""Data: batches of Datum records from an LMDB or LevelDB database, in key order, sharded by
worker."""
import numpy as np

from ... import data as data_pkg
from ... import log
from ...data import db as dbmod
from ...data.images import datum_image
from ..registry import register
from .prefetching import PrefetchingDataLayer, _child_rng, _transform_param


class _DatumBatchLoader:
    def __init__(self, reader, transformer, batch_size, rng, where):
        self.reader = reader
        self.transformer = transformer
        self.batch_size = batch_size
        self.rng = rng
        self.where = where

    def __call__(self):
        tp = self.transformer
        images = []
        labels = np.empty(self.batch_size, dtype=np.float32)
        database = self.reader.db
        self.reader.check()
        for i in range(self.batch_size):
            datum = self.reader.next_datum()
            images.append(datum_image(datum, tp.force_color, tp.force_gray,
                                      "in %s database %s" % (database.kind, database.path)))
            labels[i] = datum.label
        shapes = [image.shape for image in images]
        if not tp.can_batch(shapes):
            other = next(s for s in shapes if s != shapes[0])
            raise dbmod.DataError(
                "%s: records of %s database %s differ in shape within one batch (%s and "
                "%s); use batch_size 1, images of one size, or a crop_size"
                % (self.where, database.kind, database.path, "x".join(map(str, shapes[0])),
                   "x".join(map(str, other))))
        return tp.transform_images(images, self.rng), labels

    def state(self):
        return {"reader": self.reader.state(), "rng": self.rng.bit_generator.state}

    def restore(self, state):
        self.reader.restore(state["reader"])
        self.rng.bit_generator.state = state["rng"]


@register("Data")
class DataLayer(PrefetchingDataLayer):
    def _transform_param(self):
        tp = _transform_param(self.param, self.param.data_param)
        if self.param.data_param.force_encoded_color:
            tp.force_color = True
        return tp

    def _make_loader(self):
        dp = self.param.data_param
        where = "Data layer %r" % self.name
        if not dp.source:
            raise self.error("data_param.source is not set")
        if dp.batch_size <= 0:
            raise self.error("data_param.batch_size must be positive, not %d" % dp.batch_size)
        rank, size, _ = self._shard()
        try:
            source, rank, size = data_pkg.select_source(dp.source, dp.shared_file_system,
                                                        rank, size)
        except FileNotFoundError as exc:
            raise self.error("worker %d of %d reads partition %s, which does not exist (make "
                             "it with make_partitions %s %d)" % (rank, size, exc.args[0],
                                                                 dp.source, size)) from None
        if source != dp.source:
            log.info("%s: this client's partition %s (worker %d of %d on it)", self.name,
                     source, rank, size)
        try:
            database = dbmod.DatumDB(source)
        except dbmod.DataError as exc:
            raise self.error(str(exc)) from None
        self._resources.closers.append(database.close)
        self.database = database
        dbmod.note_declared_backend(dp, database, where)
        log.info("Opened %s %s", database.kind.lower(), source)
        first = database.first_datum()
        tp = self.transformer
        sample = datum_image(first, tp.force_color, tp.force_gray,
                            "in %s database %s" % (database.kind, source))
        shape = (dp.batch_size,) + tp.output_shape(*sample.shape)
        rng = _child_rng()
        skip = int(rng.integers(0, dp.rand_skip)) if dp.rand_skip else 0
        reader = dbmod.ShardedRecordReader(database, rank, size, skip)
        self._resources.closers.insert(0, reader.close)
        return _DatumBatchLoader(reader, tp, dp.batch_size, rng, where), shape
