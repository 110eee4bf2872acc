"""WindowData: batches of foreground and background windows cut from the images a window
file names, as Caffe's R-CNN-style WindowDataLayer makes them."""
import numpy as np

from ... import log
from ...data.images import join_root, read_image, resize
from ...data.lists import read_window_file
from ...data.transform import load_mean_file
from ..registry import register
from .prefetching import PrefetchingDataLayer, _child_rng


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
class WindowDataLayer(PrefetchingDataLayer):
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
