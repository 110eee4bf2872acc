"""Caffe's list files: the image list of ImageData and convert_imageset, the window file of
WindowData. Each reader returns plain tuples and raises DataError naming the file and line."""
import os

import numpy as np

from .db import DataError


def read_image_list(path, where):
    """Caffe's list file: one ``filename label`` per line, split at the last space."""
    if not os.path.isfile(path):
        raise DataError("%s: image list file %s does not exist" % (where, path))
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
                raise DataError("%s: line %d of image list %s is %r; expected "
                                      "'filename label'" % (where, number, path, line)) from None
    if not lines:
        raise DataError("%s: image list file %s names no images" % (where, path))
    return lines


def read_window_file(path, where):
    """Caffe's window file: per image '# index', path, channels, height, width, count, then
    one 'class overlap x1 y1 x2 y2' line per window."""
    if not os.path.isfile(path):
        raise DataError("%s: window file %s does not exist" % (where, path))
    with open(path) as f:
        tokens = f.read().split("\n")
    images, windows = [], []
    i = 0

    def fail(msg):
        raise DataError("%s: window file %s, line %d: %s" % (where, path, i + 1, msg))

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
