"""Resize images once, when writing: decode, stretch to a square, store as JPEG or raw pixels.

Training reads every image every epoch; a 512 px JPEG read at 224 spends most
of its decode on pixels the resize then throws away. Written already at the
training size, the loader decodes a quarter of the pixels and resizes nothing.

The geometry is the loader's (:func:`tfshards.reading.decode.decode_image`): the image
is stretched to ``size`` x ``size`` whatever its aspect ratio, with no crop,
so a set read through a pre-resized copy shows the model the same shapes.
The filter is Pillow's bilinear, which widens to cover every source pixel
when shrinking (an antialiased average), unlike ``tf.image.resize``'s
bilinear that samples 2 x 2 pixels. Grey images (modes ``1``, ``L``, ``LA``,
16-bit grey and a 16-bit grey + alpha PNG) stay grey; colour modes become RGB
(an alpha channel is dropped). EXIF orientation is ignored, as TensorFlow's
decoders ignore it.

16-bit samples become 8-bit the way TensorFlow's ``decode_png(dtype=uint8)``
does: the high byte (libpng's strip-16, ``v >> 8``; 32895 -> 128, 255 -> 0).
Pillow reads 16-bit colour PNGs that way itself; 16-bit grey (modes ``I;16*``)
and mode ``I`` (taken as 16-bit samples, 0..65535) are shifted here. Mode
``F`` (float pixels, which no TensorFlow decoder reads, so no scale to match)
and anything else Pillow cannot turn into 8-bit grey or RGB are refused, as is
an image over Pillow's decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``,
89.5 M pixels by default; Pillow would only warn below twice that).

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
from tfshards.shardset.resize import JPEG_QUALITY, Resize

_GREY = ("1", "L", "LA")
_GREY_16 = ("I;16", "I;16B", "I;16L", "I;16N", "I")  # shifted to their high byte
_COLOUR = ("RGB", "RGBA", "RGBX", "RGBa", "P", "PA", "CMYK", "YCbCr", "LAB", "HSV")
_PNG_GREY = (0, 4)  # IHDR colour types: grey, grey + alpha (16-bit: Pillow opens it as RGBA)
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
            pixels = _eight_bit(image, data)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise InputError(f"image too large to resize: {exc}") from None
    except (
        UnidentifiedImageError,
        OSError,
        ValueError,
        SyntaxError,
    ) as exc:  # what Pillow raises for bad bytes (SyntaxError: some malformed headers)
        raise InputError(f"cannot decode as an image to resize: {exc}") from None
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


def _eight_bit(image: Any, data: bytes) -> Any:
    """``image`` as 8-bit ``L`` or ``RGB``, with TensorFlow's 16 -> 8 bit rule.

    Raises:
        InputError: a mode with no such conversion (``F``, ``I`` outside 0..65535, others).
    """
    from PIL import Image

    mode = image.mode
    if mode in _GREY:
        return image.convert("L")
    if mode in _COLOUR:
        if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 25 and data[25] in _PNG_GREY:
            return image.getchannel(0)  # a 16-bit grey + alpha PNG, R = G = B
        return image.convert("RGB")
    if mode in _GREY_16:
        import numpy as np

        samples = np.asarray(image)
        if mode == "I" and samples.size and (samples.min() < 0 or samples.max() > 0xFFFF):
            raise InputError(
                f"cannot resize an image of mode I: expected 16-bit samples 0..65535, "
                f"found {samples.min()}..{samples.max()}"
            )
        return Image.fromarray((samples >> 8).astype(np.uint8))
    if mode == "F":
        raise InputError(
            "cannot resize an image of mode F (float pixels): no TensorFlow decoder reads "
            "one, so there is no 8-bit scale to match; store it as 8- or 16-bit"
        )
    raise InputError(
        f"cannot resize an image of mode {mode}: expected 8-bit grey or colour, "
        f"16-bit grey or integer (I, 0..65535) pixels"
    )
