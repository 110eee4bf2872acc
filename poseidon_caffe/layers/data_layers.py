"""Layer family: data_layers — Data (LMDB), ImageData, HDF5Data, HDF5Output, WindowData.

The prefetching layers (Data, ImageData, WindowData) build a loader object that makes whole
batches (read, decode, transform) and run it through a Prefetcher with data_param.prefetch
batches in flight (0: load in forward, no thread). The loader owns its own random generator,
seeded from the process generator at setup, so a seeded run gives the same batches with or
without prefetch. The thread and the LMDB environment are released by ``close()``, when the
layer is collected, or at interpreter exit, whichever comes first.
"""
import os
import weakref

import numpy as np

from .. import data as data_pkg
from .. import log
from ..data import db as dbmod
from ..data.images import datum_image, join_root, read_image, resize
from ..data.prefetch import Prefetcher
from ..data.transform import DataTransformer, load_mean_file
from ..proto import caffe_pb2
from ..rng import get_rng
from .base import Layer, TRAIN
from .registry import register


def _child_rng():
    return np.random.default_rng(int(get_rng().integers(0, 2 ** 63 - 1)))


def _transform_param(layer_param, sub_param):
    """transform_param, with the fields old nets kept in data_param / image_data_param."""
    tp = caffe_pb2.TransformationParameter()
    tp.CopyFrom(layer_param.transform_param)
    for field in ("scale", "mean_file", "crop_size", "mirror"):
        if sub_param.DESCRIPTOR.fields_by_name.get(field) is None:
            continue
        if sub_param.HasField(field) and not tp.HasField(field):
            setattr(tp, field, getattr(sub_param, field))
    return tp




class _Resources:
    """What a data layer must release: its prefetch thread first, then its files."""

    def __init__(self):
        self.prefetcher = None
        self.closers = []

    def close(self):
        if self.prefetcher is not None:
            self.prefetcher.stop()
        for closer in self.closers:
            closer()
        self.closers = []


class _PrefetchingDataLayer(Layer):
    exact_bottoms = 0
    min_tops = 1
    max_tops = 2

    # subclasses define _make_loader() -> (loader callable -> (data, labels), batch shape)

    def setup(self, bottom, top):
        self._resources = _Resources()
        self._finalizer = weakref.finalize(self, self._resources.close)
        self.output_labels = len(top) > 1
        self.transformer = DataTransformer(
            self._transform_param(), self.phase, "%s layer %r" % (self.type, self.name))
        self._loader, shape = self._make_loader()
        self._shape = shape
        self._consumed_state = self._loader.state()
        self._start_prefetch()
        log.info("output data size: %s", ",".join(str(s) for s in shape))

    def _start_prefetch(self):
        loader = self._loader      # the thread holds the loader, never the layer

        def produce():
            data, labels = loader()
            return data, labels, loader.state()

        self._resources.prefetcher = Prefetcher(produce, self.param.data_param.prefetch,
                                                "%s-%s" % (self.type, self.name))

    def _transform_param(self):
        return self.param.transform_param

    @property
    def prefetcher(self):
        return self._resources.prefetcher

    def skip_batch(self):
        """Advance the record stream by one batch without producing it (a worker passes over
        the test batches another worker runs)."""
        self._resources.prefetcher.next()

    def reshape(self, bottom, top):
        top[0].reshape(self._shape)
        if self.output_labels:
            top[1].reshape((self._shape[0],))

    def forward(self, bottom, top):
        data, labels, self._consumed_state = self._resources.prefetcher.next()
        top[0].reshape(data.shape)
        top[0].data[...] = self.backend.to_device(data)
        if self.output_labels:
            top[1].reshape(labels.shape)
            top[1].data[...] = self.backend.to_device(labels)

    def close(self):
        """Stop the prefetch thread and release the files; the layer is done after this."""
        if hasattr(self, "_finalizer"):
            self._finalizer()

    # the solver keeps these in a snapshot's side file, so a resumed run reads on from the
    # batch after the last one trained on, with the same random crops and mirrors
    def get_resume_state(self):
        return self._consumed_state

    def set_resume_state(self, state):
        self._resources.prefetcher.stop()
        self._loader.restore(state)
        self._consumed_state = self._loader.state()
        self._start_prefetch()

    def _shard(self):
        """(rank, size, partitioned) for this layer: TEST nets read everything, as in Caffe."""
        rank, size, partitioned = data_pkg.get_worker()
        if self.phase != TRAIN or size == 1:
            return 0, 1, False
        return rank, size, partitioned


# -- Data (LMDB) -------------------------------------------------------------------------------

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
        for i in range(self.batch_size):
            datum = self.reader.next_datum()
            images.append(datum_image(datum, tp.force_color, tp.force_gray,
                                      "in LMDB database %s" % self.reader.db.path))
            labels[i] = datum.label
        shapes = [image.shape for image in images]
        if not tp.can_batch(shapes):
            other = next(s for s in shapes if s != shapes[0])
            raise dbmod.DataError(
                "%s: records of LMDB database %s differ in shape within one batch (%s and "
                "%s); use batch_size 1, images of one size, or a crop_size"
                % (self.where, self.reader.db.path, "x".join(map(str, shapes[0])),
                   "x".join(map(str, other))))
        return tp.transform_images(images, self.rng), labels

    def state(self):
        return {"reader": self.reader.state(), "rng": self.rng.bit_generator.state}

    def restore(self, state):
        self.reader.restore(state["reader"])
        self.rng.bit_generator.state = state["rng"]


@register("Data")
class DataLayer(_PrefetchingDataLayer):
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
        dbmod.check_backend(dp.backend, where, dp.source)
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
        log.info("Opened lmdb %s", source)
        first = database.first_datum()
        tp = self.transformer
        sample = datum_image(first, tp.force_color, tp.force_gray, "in LMDB database " + source)
        shape = (dp.batch_size,) + tp.output_shape(*sample.shape)
        rng = _child_rng()
        skip = int(rng.integers(0, dp.rand_skip)) if dp.rand_skip else 0
        reader = dbmod.ShardedRecordReader(database, rank, size, skip)
        self._resources.closers.insert(0, reader.close)
        return _DatumBatchLoader(reader, tp, dp.batch_size, rng, where), shape


# -- ImageData ---------------------------------------------------------------------------------

def read_image_list(path, where):
    """Caffe's list file: one ``filename label`` per line, split at the last space."""
    if not os.path.isfile(path):
        raise dbmod.DataError("%s: image list file %s does not exist" % (where, path))
    lines = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            name, sep, label = line.rpartition(" ")
            try:
                if not sep or not name:
                    raise ValueError
                lines.append((name, int(label)))
            except ValueError:
                raise dbmod.DataError("%s: line %d of image list %s is %r; expected "
                                      "'filename label'" % (where, number, path, line)) from None
    if not lines:
        raise dbmod.DataError("%s: image list file %s names no images" % (where, path))
    return lines


class _ImageListLoader:
    def __init__(self, lines, root, param, transformer, rng, rank, size, list_path):
        self.all_lines = list(lines)
        self.order = np.arange(len(self.all_lines))
        self.lines = self.all_lines
        self.root = root
        self.param = param
        self.transformer = transformer
        self.rng = rng
        self.rank, self.size = rank, size
        self.list_path = list_path
        self.position = 0
        self.offset = 0
        if param.shuffle:
            self._shuffle()
        if param.rand_skip:
            self.position = int(rng.integers(0, param.rand_skip)) % len(self.lines)

    def _shuffle(self):
        self.order = self.order[self.rng.permutation(len(self.order))]
        self.lines = [self.all_lines[i] for i in self.order]

    def state(self):
        return {"position": int(self.position), "offset": int(self.offset),
                "order": self.order.tolist() if self.param.shuffle else None,
                "rng": self.rng.bit_generator.state}

    def restore(self, state):
        self.position, self.offset = int(state["position"]), int(state["offset"])
        if state.get("order") is not None:
            self.order = np.asarray(state["order"], dtype=np.int64)
            self.lines = [self.all_lines[i] for i in self.order]
        self.rng.bit_generator.state = state["rng"]

    def _advance(self):
        self.position += 1
        self.offset += 1
        if self.position >= len(self.lines):
            log.info("Restarting data prefetching from start.")
            self.position = 0
            if self.param.shuffle:
                self._shuffle()

    def read(self, name):
        p = self.param
        path = join_root(self.root, name)
        try:
            return read_image(path, p.new_height, p.new_width, p.is_color)
        except dbmod.DataError as exc:
            raise dbmod.DataError("%s (named in image list %s)" % (exc, self.list_path)) from None

    def __call__(self):
        images = []
        labels = np.empty(self.param.batch_size, dtype=np.float32)
        for i in range(self.param.batch_size):
            while self.offset % self.size != self.rank:
                self._advance()
            name, label = self.lines[self.position]
            images.append(self.read(name).transpose(2, 0, 1))
            labels[i] = label
            self._advance()
        shapes = [image.shape for image in images]
        if not self.transformer.can_batch(shapes):
            other = next(s for s in shapes if s != shapes[0])
            raise dbmod.DataError("images of list %s differ in size within one batch (%s and "
                                  "%s); set new_height and new_width, a crop_size, or use "
                                  "batch_size 1" % (self.list_path, shapes[0], other))
        return self.transformer.transform_images(images, self.rng), labels


@register("ImageData")
class ImageDataLayer(_PrefetchingDataLayer):
    def _transform_param(self):
        return _transform_param(self.param, self.param.image_data_param)

    def _make_loader(self):
        p = self.param.image_data_param
        where = "ImageData layer %r" % self.name
        if (p.new_height > 0) != (p.new_width > 0):
            raise self.error("new_height and new_width must be set together")
        if p.batch_size <= 0:
            raise self.error("image_data_param.batch_size must be positive")
        lines = read_image_list(p.source, where)
        log.info("A total of %d images.", len(lines))
        rank, size, _ = self._shard()
        loader = _ImageListLoader(lines, p.root_folder, p, self.transformer, _child_rng(),
                                  rank, size, p.source)
        first = loader.read(loader.lines[loader.position][0]).transpose(2, 0, 1)
        shape = (p.batch_size,) + self.transformer.output_shape(*first.shape)
        return loader, shape


# -- WindowData --------------------------------------------------------------------------------

def read_window_file(path, where):
    """Caffe's window file: per image '# index', path, channels, height, width, count, then
    one 'class overlap x1 y1 x2 y2' line per window."""
    if not os.path.isfile(path):
        raise dbmod.DataError("%s: window file %s does not exist" % (where, path))
    with open(path) as f:
        tokens = f.read().split("\n")
    images, windows = [], []
    i = 0

    def fail(msg):
        raise dbmod.DataError("%s: window file %s, line %d: %s" % (where, path, i + 1, msg))

    while i < len(tokens):
        line = tokens[i].strip()
        if not line:
            i += 1
            continue
        if not line.startswith("#"):
            fail("expected '# image_index', found %r" % line)
        try:
            image_path = tokens[i + 1].strip()
            c, h, w = (int(tokens[i + k].strip()) for k in (2, 3, 4))
            count = int(tokens[i + 5].strip())
        except (IndexError, ValueError):
            fail("an image entry needs path, channels, height, width and window count lines")
        image_index = len(images)
        images.append((image_path, (c, h, w)))
        for k in range(count):
            i_line = i + 6 + k
            parts = tokens[i_line].split() if i_line < len(tokens) else []
            if len(parts) != 6:
                i = i_line
                fail("expected 'class overlap x1 y1 x2 y2'")
            # overlap in single precision, as Caffe reads it, so that it compares with the
            # float thresholds as there (0.3 in the file meets fg_threshold 0.3)
            label, overlap = int(parts[0]), float(np.float32(parts[1]))
            x1, y1, x2, y2 = (int(float(v)) for v in parts[2:])
            windows.append((image_index, label, overlap, x1, y1, x2, y2))
        i += 6 + count
    return images, windows


def _foreground_count(wp):
    """Foreground windows per batch: batch_size * fg_fraction truncated, the product taken in
    single precision as Caffe does (so 10 * 0.7 gives 7, not the 6 of double precision)."""
    return int(np.float32(wp.batch_size) * np.float32(wp.fg_fraction))


def _round_half_away(x):
    """C's round(): halves away from zero (Python's round() goes to even)."""
    return int(np.floor(abs(x) + 0.5) * (1 if x >= 0 else -1))


class _WindowLoader:
    """Caffe's WindowDataLayer batch: fg_fraction foreground windows, the rest background;
    each window padded by context, warped (or squared) to crop_size, mirrored, mean-subtracted,
    scaled."""

    def __init__(self, layer, images, fg, bg, mean, rng):
        wp = layer.param.window_data_param
        tp = layer.param.transform_param
        self.wp, self.images, self.fg, self.bg = wp, images, fg, bg
        self.crop = tp.crop_size or wp.crop_size
        self.scale = tp.scale if tp.HasField("scale") else wp.scale
        self.mirror = tp.mirror or wp.mirror
        self.mean = mean
        self.mean_values = (np.asarray(tp.mean_value, dtype=np.float32)
                            if len(tp.mean_value) else None)
        self.rng = rng
        self.cache = {}

    def _image(self, index):
        path, _ = self.images[index]
        if path in self.cache:
            return self.cache[path]
        image = read_image(join_root(self.wp.root_folder, path), 0, 0, True)
        if self.wp.cache_images:
            self.cache[path] = image
        return image

    def _window(self, window):
        image_index, label, _, x1, y1, x2, y2 = window
        image = self._image(image_index)
        crop, pad = self.crop, self.wp.context_pad
        height, width = image.shape[:2]
        use_square = self.wp.crop_mode == "square"
        mirror = self.mirror and bool(self.rng.integers(0, 2))
        out_w = out_h = crop
        off_x = off_y = 0
        if pad > 0 or use_square:
            # grow the box by the context padding (in output pixels), as Caffe's warp does
            context_scale = crop / float(crop - 2 * pad)
            half_h = (y2 - y1 + 1) / 2.0
            half_w = (x2 - x1 + 1) / 2.0
            center_x, center_y = x1 + half_w, y1 + half_h
            if use_square:
                half_h = half_w = max(half_h, half_w)
            x1 = _round_half_away(center_x - half_w * context_scale)
            x2 = _round_half_away(center_x + half_w * context_scale)
            y1 = _round_half_away(center_y - half_h * context_scale)
            y2 = _round_half_away(center_y + half_h * context_scale)
            unclipped_h, unclipped_w = y2 - y1 + 1, x2 - x1 + 1
            pad_x1, pad_y1 = max(0, -x1), max(0, -y1)
            pad_x2, pad_y2 = max(0, x2 - width + 1), max(0, y2 - height + 1)
            x1, x2 = x1 + pad_x1, x2 - pad_x2
            y1, y2 = y1 + pad_y1, y2 - pad_y2
            clipped_h, clipped_w = y2 - y1 + 1, x2 - x1 + 1
            scale_x = crop / float(unclipped_w)
            scale_y = crop / float(unclipped_h)
            out_w = _round_half_away(clipped_w * scale_x)
            out_h = _round_half_away(clipped_h * scale_y)
            pad_x1 = _round_half_away(pad_x1 * scale_x)
            pad_x2 = _round_half_away(pad_x2 * scale_x)
            pad_y1 = _round_half_away(pad_y1 * scale_y)
            off_y = pad_y1
            # a mirrored patch sits where the right-hand padding was
            off_x = pad_x2 if mirror else pad_x1
            if off_y + out_h > crop:
                out_h = crop - off_y
            if off_x + out_w > crop:
                out_w = crop - off_x
        # a window thinner than one output pixel still yields one
        out_h, out_w = max(out_h, 1), max(out_w, 1)
        off_y, off_x = min(off_y, crop - out_h), min(off_x, crop - out_w)
        patch = resize(image[y1:y2 + 1, x1:x2 + 1], out_h, out_w)
        if mirror:
            patch = patch[:, ::-1]
        channels = patch.shape[2]
        out = np.zeros((channels, crop, crop), dtype=np.float32)
        region = (slice(None), slice(off_y, off_y + out_h), slice(off_x, off_x + out_w))
        values = patch.transpose(2, 0, 1).astype(np.float32)
        if self.mean is not None:
            mh, mw = self.mean.shape[1:]
            mean_off = ((mh - crop) // 2, (mw - crop) // 2)
            mean = self.mean[:, mean_off[0] + off_y:mean_off[0] + off_y + out_h,
                             mean_off[1] + off_x:mean_off[1] + off_x + out_w]
            values -= mean
        elif self.mean_values is not None:
            values -= self.mean_values.reshape(-1, 1, 1) if len(self.mean_values) > 1 \
                else self.mean_values[0]
        out[region] = values * np.float32(self.scale)
        return out, label

    def state(self):
        return {"rng": self.rng.bit_generator.state}

    def restore(self, state):
        self.rng.bit_generator.state = state["rng"]

    def __call__(self):
        batch = self.wp.batch_size
        num_fg = _foreground_count(self.wp)
        # background windows fill the front of the batch, foreground the rest, as in Caffe
        picks = ([self.bg[i] for i in self.rng.integers(0, len(self.bg), batch - num_fg)]
                 if batch - num_fg else [])
        if num_fg:
            picks += [self.fg[i] for i in self.rng.integers(0, len(self.fg), num_fg)]
        data = np.empty((batch, 3, self.crop, self.crop), dtype=np.float32)
        labels = np.empty(batch, dtype=np.float32)
        for i, window in enumerate(picks):
            data[i], labels[i] = self._window(window)
        return data, labels


@register("WindowData")
class WindowDataLayer(_PrefetchingDataLayer):
    def _make_loader(self):
        wp = self.param.window_data_param
        tp = self.param.transform_param
        where = "WindowData layer %r" % self.name
        crop = tp.crop_size or wp.crop_size
        if crop <= 0:
            raise self.error("needs a crop_size (transform_param.crop_size)")
        if wp.crop_mode not in ("warp", "square"):
            raise self.error("crop_mode must be 'warp' or 'square', not %r" % wp.crop_mode)
        images, windows = read_window_file(wp.source, where)
        fg = [w for w in windows if w[2] >= wp.fg_threshold]
        # a window is background only when it is not foreground; labelled 0, as Caffe does
        bg = [(w[0], 0) + w[2:] for w in windows
              if w[2] < wp.bg_threshold and not w[2] >= wp.fg_threshold]
        log.info("Number of images: %d, foreground windows: %d, background windows: %d",
                 len(images), len(fg), len(bg))
        num_fg = _foreground_count(wp)
        if (num_fg and not fg) or (wp.batch_size - num_fg and not bg):
            raise self.error("window file %s has no %s windows for the requested fg_fraction"
                             % (wp.source, "foreground" if num_fg and not fg else "background"))
        mean = None
        mean_file = tp.mean_file if tp.HasField("mean_file") else wp.mean_file
        if mean_file:
            mean = load_mean_file(mean_file)
            if mean.shape[1] < crop or mean.shape[2] < crop:
                raise self.error("mean file %s is %dx%d, smaller than crop_size %d"
                                 % (mean_file, mean.shape[1], mean.shape[2], crop))
        loader = _WindowLoader(self, images, fg, bg, mean, _child_rng())
        return loader, (wp.batch_size, 3, crop, crop)


# -- HDF5 --------------------------------------------------------------------------------------

def _h5py(where):
    try:
        import h5py
    except ImportError:
        raise dbmod.DataError("%s needs h5py, which is not installed: pip install "
                              "'poseidon-caffe[hdf5]' (or pip install h5py)" % where) from None
    return h5py


@register("HDF5Data")
class HDF5DataLayer(Layer):
    """Batches from the HDF5 files a source list names; one dataset per top, read whole per
    file, rows in order (or shuffled per file, files in shuffled order, with ``shuffle``)."""
    exact_bottoms = 0
    min_tops = 1

    def setup(self, bottom, top):
        p = self.param.hdf5_data_param
        self.where = "HDF5Data layer %r" % self.name
        self.h5py = _h5py(self.where)
        if p.batch_size <= 0:
            raise self.error("hdf5_data_param.batch_size must be positive")
        if not os.path.isfile(p.source):
            raise self.error("HDF5 source list %s does not exist" % p.source)
        with open(p.source) as f:
            self.files = [line.strip() for line in f if line.strip()]
        if not self.files:
            raise self.error("HDF5 source list %s names no files" % p.source)
        log.info("Number of HDF5 files: %d", len(self.files))
        self.top_names = list(self.param.top)
        while len(self.top_names) < len(top):
            self.top_names.append("top%d" % len(self.top_names))
        self.rng = _child_rng()
        rank, size, _ = data_pkg.get_worker()
        self.rank, self.size = (rank, size) if self.phase == TRAIN else (0, 1)
        self.file_order = list(range(len(self.files)))
        if p.shuffle:
            self.file_order = list(self.rng.permutation(len(self.files)))
        self.file_pos = 0
        self.offset = 0
        self._load_file(self.file_order[0])
        self._shapes = [(p.batch_size,) + arr.shape[1:] for arr in self.arrays]

    def _load_file(self, index):
        path = self.files[index]
        if not os.path.isfile(path):
            raise self.error("HDF5 file %s (listed in %s) does not exist"
                             % (path, self.param.hdf5_data_param.source))
        arrays = []
        try:
            with self.h5py.File(path, "r") as f:
                for name in self.top_names:
                    if name not in f:
                        raise self.error("HDF5 file %s has no dataset %r (one per top)"
                                         % (path, name))
                    arrays.append(np.asarray(f[name], dtype=np.float32))
        except OSError as exc:
            raise self.error("cannot read HDF5 file %s: %s" % (path, exc)) from None
        rows = {arr.shape[0] if arr.ndim else 0 for arr in arrays}
        if len(rows) != 1 or 0 in rows:
            raise self.error("datasets of HDF5 file %s must share a first dimension > 0; "
                             "found %s" % (path, [a.shape for a in arrays]))
        self.arrays = arrays
        self.rows = np.arange(rows.pop())
        if self.param.hdf5_data_param.shuffle:
            self.rng.shuffle(self.rows)
        self.row_pos = 0
        log.info("Successfully loaded %d rows from %s", len(self.rows), path)

    def _next_file(self):
        self.file_pos += 1
        if self.file_pos >= len(self.file_order):
            self.file_pos = 0
            if self.param.hdf5_data_param.shuffle:
                self.file_order = list(self.rng.permutation(len(self.files)))
        if len(self.files) > 1 or self.param.hdf5_data_param.shuffle:
            self._load_file(self.file_order[self.file_pos])
        else:
            self.row_pos = 0

    def reshape(self, bottom, top):
        for blob, shape in zip(top, self._shapes):
            blob.reshape(shape)

    def get_resume_state(self):
        return {"file_order": [int(i) for i in self.file_order], "file_pos": int(self.file_pos),
                "rows": self.rows.tolist(), "row_pos": int(self.row_pos), "offset": int(self.offset),
                "rng": self.rng.bit_generator.state}

    def set_resume_state(self, state):
        self.file_order = [int(i) for i in state["file_order"]]
        self.file_pos = int(state["file_pos"])
        self._load_file(self.file_order[self.file_pos])
        self.rows = np.asarray(state["rows"], dtype=np.int64)
        self.row_pos, self.offset = int(state["row_pos"]), int(state["offset"])
        self.rng.bit_generator.state = state["rng"]

    def forward(self, bottom, top):
        batch = self.param.hdf5_data_param.batch_size
        filled = 0
        while filled < batch:
            # rows this worker keeps among the rest of the current file
            remaining = self.rows[self.row_pos:]
            offsets = self.offset + np.arange(len(remaining))
            mine = np.nonzero(offsets % self.size == self.rank)[0][:batch - filled]
            consumed = (mine[-1] + 1) if len(mine) == batch - filled else len(remaining)
            for blob, arr in zip(top, self.arrays):
                blob.data[filled:filled + len(mine)] = self.backend.to_device(
                    arr[remaining[mine]])
            filled += len(mine)
            self.row_pos += consumed
            self.offset += consumed
            if self.row_pos >= len(self.rows):
                self._next_file()


@register("HDF5Output")
class HDF5OutputLayer(Layer):
    """Appends every batch of its two bottoms to datasets 'data' and 'label' of file_name
    (Caffe's file holds one batch only; this one keeps every batch)."""
    exact_bottoms = 2
    exact_tops = 0

    def setup(self, bottom, top):
        where = "HDF5Output layer %r" % self.name
        h5py = _h5py(where)
        self.path = self.param.hdf5_output_param.file_name
        if not self.path:
            raise self.error("hdf5_output_param.file_name is not set")
        try:
            self.file = h5py.File(self.path, "w")
        except OSError as exc:
            raise self.error("cannot create HDF5 file %s: %s" % (self.path, exc)) from None
        self._finalizer = weakref.finalize(self, self.file.close)
        self.datasets = None

    def reshape(self, bottom, top):
        if bottom[0].shape[0] != bottom[1].shape[0]:
            raise self.error("data and label bottoms must have the same num: %s vs %s"
                             % (bottom[0].shape, bottom[1].shape))

    def forward(self, bottom, top):
        # Caffe writes num x channels x height x width (missing axes as 1), e.g. labels of
        # shape (N,) as N x 1 x 1 x 1, so readers of its files find four axes
        arrays = [np.asarray(self.backend.to_host(b.data), dtype=np.float32) for b in bottom]
        arrays = [a.reshape(a.shape + (1,) * (4 - a.ndim)) if a.ndim < 4 else a for a in arrays]
        if self.datasets is None:
            self.datasets = [self.file.create_dataset(name, shape=(0,) + a.shape[1:],
                                                      maxshape=(None,) + a.shape[1:],
                                                      dtype="f4")
                             for name, a in zip(("data", "label"), arrays)]
        for ds, arr in zip(self.datasets, arrays):
            if ds.shape[1:] != arr.shape[1:]:
                raise self.error("bottom shape changed from %s to %s; HDF5 output needs one "
                                 "shape per file" % (ds.shape[1:], arr.shape[1:]))
            start = ds.shape[0]
            ds.resize(start + arr.shape[0], axis=0)
            ds[start:] = arr
        self.file.flush()

    def close(self):
        self._finalizer()
