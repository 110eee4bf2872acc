"""Encoded Datum images (PNG, JPEG) decoded the way Caffe decodes them."""
import numpy as np

from .errors import ProtoFileError


def _decode_image(encoded, source):
    """C x H x W uint8 from PNG/JPEG bytes, channels in BGR order as Caffe decodes them."""
    import io as _bytes_io
    from PIL import Image
    try:
        img = Image.open(_bytes_io.BytesIO(encoded))
        img.load()
    except Exception as e:    # Pillow raises many kinds for corrupt data
        raise ProtoFileError("%s: encoded Datum holds no decodable image: %s"
                             % (source, str(e).replace("\n", " "))) from None
    if img.mode not in ("L", "RGB"):
        img = img.convert("L" if img.mode in ("1", "I", "I;16", "F") else "RGB")
    pixels = np.asarray(img, dtype=np.uint8)
    if pixels.ndim == 2:
        return pixels[np.newaxis].copy()
    return np.ascontiguousarray(pixels[:, :, ::-1].transpose(2, 0, 1))
