"""Caffe's DataTransformer, applied to a whole batch at once.

For every image, in Caffe's order: choose the crop (random offsets at TRAIN, the centre at
TEST), choose to mirror (a coin flip whenever ``mirror`` is set, in either phase, as Caffe's
``param.mirror() && Rand(2)``), subtract the mean (the mean file's pixel at the same source
position, i.e. cropped like the data, or the per-channel ``mean_value``), then multiply by
``scale``. The arithmetic is (value - mean) * scale in float32.
"""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .db import DataError


class DataTransformer:
    def __init__(self, param, phase, where="data layer"):
        from ..proto import caffe_pb2
        self.param = param
        self.phase = phase
        self.train = phase == caffe_pb2.TRAIN
        self.where = where
        self.scale = np.float32(param.scale)
        self.crop_size = int(param.crop_size)
        self.mirror = bool(param.mirror)
        self.force_color = bool(param.force_color)
        self.force_gray = bool(param.force_gray)
        if self.force_color and self.force_gray:
            raise DataError("%s: transform_param sets both force_color and force_gray" % where)
        self.mean = None
        self.mean_values = None
        if param.HasField("mean_file"):
            if len(param.mean_value):
                raise DataError("%s: transform_param cannot set both mean_file and mean_value"
                                % where)
            self.mean_file = param.mean_file
            self.mean = load_mean_file(param.mean_file)
        elif len(param.mean_value):
            self.mean_values = np.asarray(param.mean_value, dtype=np.float32)

    def output_shape(self, channels, height, width):
        """C x H x W of a transformed image, after checking the input fits the parameters."""
        self.check_input(channels, height, width)
        if self.crop_size:
            return channels, self.crop_size, self.crop_size
        return channels, height, width

    def check_input(self, channels, height, width):
        if self.crop_size and (height < self.crop_size or width < self.crop_size):
            raise DataError("%s: crop_size %d is larger than the %dx%d input images"
                            % (self.where, self.crop_size, height, width))
        if self.mean is not None and self.mean.shape != (channels, height, width):
            raise DataError("%s: mean file %s holds a %s mean, but the data are %dx%dx%d "
                            "(channels x height x width)"
                            % (self.where, self.mean_file, "x".join(map(str, self.mean.shape)),
                               channels, height, width))
        if self.mean_values is not None and len(self.mean_values) not in (1, channels):
            raise DataError("%s: transform_param has %d mean_value entries; give one, or one "
                            "per channel (%d)" % (self.where, len(self.mean_values), channels))

    def can_batch(self, shapes):
        """Whether C x H x W images of these shapes fill one batch: equal shapes, or (as Caffe's
        per-image transform allows) one channel count and a crop that makes them equal."""
        first = shapes[0]
        if all(shape == first for shape in shapes):
            return True
        return bool(self.crop_size) and all(shape[0] == first[0] for shape in shapes)

    def transform_images(self, images, rng=None):
        """A list of C x H x W images (``can_batch`` of their shapes) -> one transformed batch."""
        shape = images[0].shape
        if all(image.shape == shape for image in images):
            return self.transform(np.stack(images), rng)
        return np.concatenate([self.transform(image[None], rng) for image in images])

    def transform(self, batch, rng=None):
        """N x C x H x W (uint8 or float) -> N x C x h x w float32, Caffe's transform per image."""
        batch = np.asarray(batch)
        n, c, h, w = batch.shape
        self.check_input(c, h, w)
        crop = self.crop_size
        # draws: the mirror flags, then the crop offsets, as Caffe's Transform does per image
        flips = (rng.integers(0, 2, size=n).astype(bool) if self.mirror
                 else np.zeros(n, dtype=bool))
        if crop and self.train:
            h_off = rng.integers(0, h - crop + 1, size=n)
            w_off = rng.integers(0, w - crop + 1, size=n)
        elif crop:
            h_off = np.full(n, (h - crop) // 2)
            w_off = np.full(n, (w - crop) // 2)
        if crop:
            data = _crop(batch, h_off, w_off, crop).astype(np.float32)
        else:
            data = batch.astype(np.float32)
        if self.mean is not None:
            mean = self.mean
            if crop:
                windows = sliding_window_view(mean, (crop, crop), axis=(1, 2))
                data -= windows[:, h_off, w_off].transpose(1, 0, 2, 3)
            else:
                data -= mean
        elif self.mean_values is not None:
            values = self.mean_values
            if len(values) == 1:
                data -= values[0]
            else:
                data -= values.reshape(1, c, 1, 1)
        if flips.any():
            data[flips] = data[flips][..., ::-1]
        if self.scale != 1:
            data *= self.scale
        return data


def _crop(batch, h_off, w_off, crop):
    """Per-image crop windows: out[i] = batch[i, :, h_off[i]:+crop, w_off[i]:+crop]."""
    if (h_off == h_off[0]).all() and (w_off == w_off[0]).all():
        return batch[:, :, h_off[0]:h_off[0] + crop, w_off[0]:w_off[0] + crop]
    windows = sliding_window_view(batch, (crop, crop), axis=(2, 3))
    return windows[np.arange(len(batch)), :, h_off, w_off]


def load_mean_file(path):
    """C x H x W float32 mean from a .binaryproto BlobProto; errors name the file."""
    from ..io import blobproto_to_array, read_blobproto
    blob = read_blobproto(path)
    arr = np.asarray(blobproto_to_array(blob, source=path), dtype=np.float32)
    if arr.ndim == 4 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 3:
        raise DataError("mean file %s holds a blob of shape %s; expected 1 x C x H x W"
                        % (path, "x".join(map(str, arr.shape))))
    return np.ascontiguousarray(arr)
