"""Resize images once, when writing: decode, stretch to a square, store as JPEG or raw pixels.

Training reads every image every epoch; a 512 px JPEG read at 224 spends most
of its decode on pixels the resize then throws away. Written already at the
training size, the loader decodes a quarter of the pixels and resizes nothing.

The geometry is the loader's (:func:`tfshards.reading.decode.decode_image`): the image
is stretched to ``size`` x ``size`` whatever its aspect ratio, with no crop,
so a set read through a pre-resized copy shows the model the same shapes.
The filter is Pillow's bilinear, which widens to cover every source pixel
when shrinking (an antialiased average), unlike ``tf.image.resize``'s
bilinear that samples 2 x 2 pixels. Pixels become 8-bit grey or RGB by
TensorFlow's rules (:mod:`tfshards.format.pixels`: 16-bit by the high byte,
an alpha channel dropped, float pixels refused); EXIF orientation is ignored,
as TensorFlow's decoders ignore it. An image over Pillow's decompression-bomb
limit (``PIL.Image.MAX_IMAGE_PIXELS``, 89.5 M pixels by default; Pillow would
only warn below twice that) is refused.

Formats: ``jpeg`` (baseline, quality :data:`JPEG_QUALITY`, 4:2:0, no
metadata) or ``raw``: the uint8 pixels in an uncompressed BMP, which
TensorFlow's ``decode_image``, Pillow and every image tool read, and whose
decode is a copy. Pillow bundles its JPEG encoder, so the bytes are a pure
function of the file, ``size``, ``format`` and the Pillow version, which
:meth:`Resize.params` records (a new Pillow names a new shard version).
"""

from __future__ import annotations

import io
import threading
import warnings
from typing import Any

from tfshards.errors import InputError
from tfshards.format.pixels import eight_bit, pillow_said
from tfshards.shardset.resize import JPEG_QUALITY, Resize

_OPEN = threading.Lock()  # the warnings filters are process-wide: one open at a time
_JPEG_OPTIONS = {"quality": JPEG_QUALITY, "subsampling": 2, "optimize": False, "progressive": False}


def resize_image(data: bytes, resize: Resize) -> bytes:
    """``data`` (any format Pillow reads) decoded, stretched to the square and encoded.

    Raises:
        InputError: the bytes do not decode as an image (without ``path``; the
            writer adds the file's).
    """
    from PIL import Image, UnidentifiedImageError  # only the writer of a resized set pays

    try:
        with _open(data) as image:
            image.load()  # the first frame of an animation, as tf.io.decode_image reads it
            pixels = eight_bit(image, data, doing="resize")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise InputError(f"image too large to resize: {pillow_said(exc)}") from None
    except (
        UnidentifiedImageError,
        OSError,
        ValueError,
        SyntaxError,
    ) as exc:  # what Pillow raises for bad bytes (SyntaxError: some malformed headers)
        raise InputError(f"cannot decode as an image to resize: {pillow_said(exc)}") from None
    side = resize.size
    if pixels.size != (side, side):
        pixels = pixels.resize((side, side), Image.Resampling.BILINEAR)
    out = io.BytesIO()
    if resize.format == "jpeg":
        pixels.save(out, "JPEG", **_JPEG_OPTIONS)
    else:
        pixels.save(out, "BMP")
    return out.getvalue()


def _open(data: bytes) -> Any:
    """``Image.open`` with Pillow's decompression-bomb warning raised, not printed.

    The filter is process-wide, so opens take turns: an open reads only the
    header, the decode runs after the lock is released.
    """
    from PIL import Image

    with _OPEN, warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        return Image.open(io.BytesIO(data))
