"""ImageData: batches of the image files a list names (``filename label`` per line)."""
import numpy as np

from ... import log
from ...data import db as dbmod
from ...data.images import join_root, read_image
from ...data.lists import read_image_list
from ..registry import register
from .prefetching import PrefetchingDataLayer, _child_rng, _transform_param


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
class ImageDataLayer(PrefetchingDataLayer):
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
