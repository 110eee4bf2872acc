"""Images the way Caffe's tools see them: H x W x C uint8 arrays in BGR order (gray: C = 1).

Decoding and encoding go through Pillow (PNG, JPEG and the other formats it reads). Resizing
follows OpenCV's cv::resize with INTER_LINEAR, which Caffe uses: pixel centres aligned
(src = (dst + 0.5) * scale - 0.5), edges clamped, and 11-bit fixed-point weights, so that a
database built here holds the pixels one built by Caffe's convert_imageset holds (to within one
grey level where OpenCV's vectorised path rounds differently).
"""
import io
import os

import numpy as np

from .db import DataError

_COEF_BITS = 11
_COEF_SCALE = 1 << _COEF_BITS


def _pil():
    try:
        from PIL import Image
    except ImportError:
        raise DataError("reading and writing images needs Pillow: pip install pillow") from None
    return Image


def _to_array(img, color):
    """Pillow image -> H x W x C uint8 BGR. color: True (3 channels), False (1), None (native)."""
    if color is None:
        if img.mode in ("L", "1", "I;16", "I", "F"):
            color = False
        elif img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
            rgba = np.asarray(img.convert("RGBA"))
            return np.ascontiguousarray(rgba[:, :, [2, 1, 0, 3]])
        else:
            color = True
    if color:
        rgb = np.asarray(img.convert("RGB"))
        return np.ascontiguousarray(rgb[:, :, ::-1])
    if img.mode in ("I;16", "I", "F"):
        # 16-bit and float greys scale to 8 bits as OpenCV's 8-bit read does (keep the top byte)
        arr = np.asarray(img, dtype=np.float64)
        maximum = 65535.0 if img.mode != "F" else max(float(arr.max()), 1.0)
        return np.clip(arr * (255.0 / maximum) + 0.5, 0, 255).astype(np.uint8)[:, :, None]
    return np.asarray(img.convert("L"))[:, :, None].copy()


def decode_image(data, color=None, name="<bytes>"):
    """Decode encoded image bytes. ``color``: True forces 3 channels, False forces grey,
    None keeps the file's own channels (Caffe's DecodeDatumNative)."""
    Image = _pil()
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except Exception as exc:    # Pillow raises many kinds for corrupt data
        raise DataError("cannot decode image %s: %s" % (name, exc)) from None
    return _to_array(img, color)


def join_root(root, name):
    """Caffe's root_folder + file name (plain concatenation), adding a missing trailing slash."""
    if root and not root.endswith("/"):
        root += "/"
    return root + name


def read_image(path, height=0, width=0, is_color=True):
    """Caffe's ReadImageToCVMat: read, force colour or grey, resize when both sizes are > 0."""
    Image = _pil()
    path = str(path)
    if not os.path.isfile(path):
        raise DataError("Could not open or find file %s" % path)
    try:
        with Image.open(path) as img:
            img.load()
            arr = _to_array(img, bool(is_color))
    except Exception as exc:
        raise DataError("Could not decode image file %s: %s" % (path, exc)) from None
    if height > 0 and width > 0:
        arr = resize(arr, height, width)
    return arr


def encode_image(arr, ext="png", quality=95):
    """H x W x C BGR (or H x W grey) uint8 -> encoded bytes (ext png, jpg/jpeg, bmp, ...)."""
    Image = _pil()
    arr = np.asarray(arr, dtype=np.uint8)
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if arr.ndim == 3:
        order = [2, 1, 0, 3] if arr.shape[2] == 4 else [2, 1, 0]
        img = Image.fromarray(np.ascontiguousarray(arr[:, :, order]))
    else:
        img = Image.fromarray(arr)
    fmt = ext.lower().lstrip(".")
    fmt = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "bmp": "BMP", "tif": "TIFF",
           "tiff": "TIFF", "ppm": "PPM", "pgm": "PPM", "webp": "WEBP"}.get(fmt)
    if fmt is None:
        raise DataError("cannot encode images as %r (use png, jpg, bmp, tiff, ppm or webp)" % ext)
    buf = io.BytesIO()
    options = {"quality": quality} if fmt in ("JPEG", "WEBP") else {}
    img.save(buf, format=fmt, **options)
    return buf.getvalue()


def _linear_taps(src_size, dst_size):
    """Source index pairs and fixed-point weights of OpenCV's INTER_LINEAR along one axis."""
    scale = src_size / dst_size
    pos = ((np.arange(dst_size, dtype=np.float64) + 0.5) * scale - 0.5).astype(np.float32)
    lo = np.floor(pos).astype(np.int64)
    frac = (pos - lo).astype(np.float32)
    low_edge = lo < 0
    high_edge = lo >= src_size - 1
    frac[low_edge | high_edge] = 0.0
    lo[low_edge] = 0
    lo[high_edge] = src_size - 1
    hi = np.minimum(lo + 1, src_size - 1)
    w1 = np.rint(frac * _COEF_SCALE).astype(np.int64)
    w0 = np.rint((np.float32(1.0) - frac) * _COEF_SCALE).astype(np.int64)
    return lo, hi, w0, w1


def resize(arr, height, width):
    """Bilinear resize of H x W x C (or N x H x W x C) uint8 images to height x width."""
    arr = np.asarray(arr)
    if arr.dtype != np.uint8:
        raise DataError("resize takes uint8 images, not %s" % arr.dtype)
    h_axis = arr.ndim - 3
    src_h, src_w = arr.shape[h_axis], arr.shape[h_axis + 1]
    if (src_h, src_w) == (height, width):
        return arr.copy()
    x_lo, x_hi, x_w0, x_w1 = _linear_taps(src_w, width)
    y_lo, y_hi, y_w0, y_w1 = _linear_taps(src_h, height)
    wide = arr.astype(np.int64)
    shape_x = (1,) * (h_axis + 1) + (width, 1)
    horiz = (np.take(wide, x_lo, axis=h_axis + 1) * x_w0.reshape(shape_x)
             + np.take(wide, x_hi, axis=h_axis + 1) * x_w1.reshape(shape_x))
    shape_y = (1,) * h_axis + (height, 1, 1)
    total = (np.take(horiz, y_lo, axis=h_axis) * y_w0.reshape(shape_y)
             + np.take(horiz, y_hi, axis=h_axis) * y_w1.reshape(shape_y))
    shift = 2 * _COEF_BITS
    out = (total + (1 << (shift - 1))) >> shift
    return np.clip(out, 0, 255).astype(np.uint8)


def datum_image(datum, force_color=False, force_gray=False, name="<datum>"):
    """C x H x W array of one Datum: uint8 for raw or encoded data, float32 for float_data."""
    if datum.encoded:
        color = True if force_color else (False if force_gray else None)
        hwc = decode_image(datum.data, color, name)
        return np.ascontiguousarray(hwc.transpose(2, 0, 1))
    shape = (datum.channels, datum.height, datum.width)
    if datum.data:
        return np.frombuffer(datum.data, dtype=np.uint8).reshape(shape)
    return np.asarray(datum.float_data, dtype=np.float32).reshape(shape)
