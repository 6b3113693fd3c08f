"""Resize images once, when writing: decode, stretch to a square, store as JPEG or raw pixels.

Training reads every image every epoch; a 512 px JPEG read at 224 spends most
of its decode on pixels the resize then throws away. Written already at the
training size, the loader decodes a quarter of the pixels and resizes nothing.

The geometry is the loader's (:func:`tfshards.reading.decode.decode_image`): the image
is stretched to ``size`` x ``size`` whatever its aspect ratio, with no crop,
so a set read through a pre-resized copy shows the model the same shapes.
The filter is Pillow's bilinear, which widens to cover every source pixel
when shrinking (an antialiased average), unlike ``tf.image.resize``'s
bilinear that samples 2 x 2 pixels. Grey images (modes ``1``, ``L``, ``LA``)
stay grey; every other mode becomes RGB (an alpha channel is dropped). EXIF
orientation is ignored, as TensorFlow's decoders ignore it.

Formats: ``jpeg`` (baseline, quality :data:`JPEG_QUALITY`, 4:2:0, no
metadata) or ``raw``: the uint8 pixels in an uncompressed BMP, which
TensorFlow's ``decode_image``, Pillow and every image tool read, and whose
decode is a copy. Pillow bundles its JPEG encoder, so the bytes are a pure
function of the file, ``size``, ``format`` and the Pillow version, which
:meth:`Resize.params` records (a new Pillow names a new shard version).
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from tfshards.errors import ConfigError, InputError

FORMATS = ("jpeg", "raw")
JPEG_QUALITY = 90  # what photo data sets are stored at; 224 px synthetic images: ~9 KB
MAX_SIZE = 8192  # sides above this are no training size; the cap keeps a typo from using GBs
_GREY = ("1", "L", "LA")
_JPEG_OPTIONS = {"quality": JPEG_QUALITY, "subsampling": 2, "optimize": False, "progressive": False}


@dataclass(frozen=True)
class Resize:
    """Store images as ``size`` x ``size`` pixels in ``format`` (``jpeg`` or ``raw``)."""

    size: int
    format: str = "jpeg"

    def __post_init__(self) -> None:
        if not 1 <= self.size <= MAX_SIZE:
            raise ConfigError(
                f"resize: expected a side of 1..{MAX_SIZE} pixels, got {self.size}", option="resize"
            )
        if self.format not in FORMATS:
            raise ConfigError(
                f"resize_format: expected one of {FORMATS}, got {self.format!r}",
                option="resize_format",
                valid=FORMATS,
            )

    def params(self) -> dict[str, Any]:
        """What shapes the stored bytes, for the manifest and the version name."""
        doc: dict[str, Any] = {
            "encoder": f"pillow {metadata.version('pillow')}",
            "filter": "bilinear",
            "format": self.format,
            "size": self.size,
        }
        if self.format == "jpeg":
            doc["quality"] = JPEG_QUALITY
        return doc

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Resize | None:
        """The resize a manifest's ``params`` record, or None for images stored as listed."""
        doc = params.get("resize")
        if not isinstance(doc, Mapping):
            return None
        return cls(int(doc["size"]), str(doc["format"]))


def resize_image(data: bytes, resize: Resize) -> bytes:
    """``data`` (any format Pillow reads) decoded, stretched to the square and encoded.

    Raises:
        InputError: the bytes do not decode as an image (without ``path``; the
            writer adds the file's).
    """
    from PIL import Image, UnidentifiedImageError  # only the writer of a resized set pays

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()  # the first frame of an animation, as tf.io.decode_image reads it
            pixels = image.convert("L" if image.mode in _GREY else "RGB")
    except (
        UnidentifiedImageError,
        Image.DecompressionBombError,
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
