"""Images of records as a person sees them: one image, or a contact sheet of many (Pillow)."""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tfshards.errors import InputError
from tfshards.format.pixels import eight_bit, pillow_said

CELL = 96  # a sheet cell's side in pixels: enough to tell images apart, 10 x 10 fit a screen
GAP = 4  # white pixels at least between two images
MAX_IMAGES = 1_000  # a sheet of more is no longer looked at, and costs ~30 KB of memory each
PNG_MODES = ("1", "L", "LA", "I;16", "I;16B", "P", "RGB", "RGBA")  # what Pillow writes as PNG
# A PNG written here says so in a tEXt chunk, before its pixels: what ``show`` may replace.
MARK = ("Software", "tfshards show")
_MARK_TEXT = MARK[0].encode() + b"\0" + MARK[1].encode()
_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def made_here(head: bytes) -> bool:
    """Whether ``head``, a file's first bytes up to its pixels, is a PNG that
    :func:`to_png` or :func:`contact_sheet` wrote: its chunks are walked to the first
    ``IDAT`` for the mark (Pillow writes a source's ICC profile, often over 4 KB, first)."""
    if not head.startswith(_SIGNATURE):
        return False
    at = len(_SIGNATURE)
    while at + 8 <= len(head):
        length, kind = int.from_bytes(head[at : at + 4], "big"), head[at + 4 : at + 8]
        if kind == b"IDAT":
            return False
        if kind == b"tEXt" and head[at + 8 : at + 8 + length] == _MARK_TEXT:
            return True
        at += 12 + length  # length, type, data, CRC
    return False


def _png_bytes(image: Any) -> bytes:
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text(*MARK)
    out = io.BytesIO()
    image.save(out, format="PNG", pnginfo=info)
    return out.getvalue()


def image_bytes(features: Mapping[str, tuple[str, Sequence[Any]]], feature: str) -> bytes:
    """The encoded image a record stores under ``feature`` (JPEG, PNG, BMP ...)."""
    found = features.get(feature)
    if found is None or found[0] != "bytes" or len(found[1]) != 1:
        kinds = {name: kind for name, (kind, _) in features.items()}
        raise InputError(
            f"feature {feature!r}: expected one encoded image (bytes), found "
            f"{found[0] + ' x ' + str(len(found[1])) if found else 'no such feature'} "
            f"(features: {kinds})"
        )
    return bytes(found[1][0])


def to_png(data: bytes, source: str) -> bytes:
    """``data`` (any format Pillow reads) as PNG bytes: its pixels as they are where PNG
    holds them (16-bit grey too), else the 8-bit grey or RGB TensorFlow decodes (CMYK)."""
    image = _open(data, source)
    if image.mode not in PNG_MODES:
        image = _eight_bit(image, data, source)
    return _png_bytes(image)


def contact_sheet(
    images: Iterable[tuple[str, bytes]],
    columns: int = 10,
    cell: int = CELL,
    unshown: list[str] | None = None,
) -> bytes:
    """A PNG grid of ``(name, encoded image)`` pairs, each fitted into a ``cell`` square,
    as TensorFlow decodes them (16-bit by the high byte: :mod:`tfshards.format.pixels`).

    An image that cannot be shown gets an empty grey cell, and its error line (naming
    it) goes to ``unshown`` when given; otherwise it stops the sheet.
    """
    from PIL import Image

    thumbs = []
    for name, data in images:
        try:
            pixels = _eight_bit(_open(data, name), data, name)
        except InputError as exc:
            if unshown is None:
                raise
            unshown.append(str(exc))
            pixels = Image.new("RGB", (cell - GAP, cell - GAP), "lightgrey")
        thumbs.append(_fitted(pixels.convert("RGB"), cell))
        if len(thumbs) > MAX_IMAGES:
            raise InputError(f"contact sheet: expected at most {MAX_IMAGES} images, found more")
    if not thumbs:
        raise InputError("contact sheet: expected at least one image, found none")
    columns = max(1, min(columns, len(thumbs)))
    rows = -(-len(thumbs) // columns)
    sheet = Image.new("RGB", (columns * cell, rows * cell), "white")
    for i, thumb in enumerate(thumbs):
        x, y = (i % columns) * cell, (i // columns) * cell
        sheet.paste(thumb, (x + (cell - thumb.width) // 2, y + (cell - thumb.height) // 2))
    return _png_bytes(sheet)


def _fitted(image: Any, cell: int) -> Any:
    """``image`` fitted into a ``cell`` square: shrunk smoothly, or grown by a whole factor
    with square pixels (an 8 px digit would be a dot in a 96 px cell)."""
    factor = (cell - GAP) // max(image.width, image.height)
    if factor >= 2:
        from PIL import Image

        size = (image.width * factor, image.height * factor)
        return image.resize(size, Image.Resampling.NEAREST)
    image.thumbnail((cell - GAP, cell - GAP))
    return image


def _eight_bit(image: Any, data: bytes, source: str) -> Any:
    """:func:`~tfshards.format.pixels.eight_bit`, its error naming ``source``."""
    try:
        return eight_bit(image, data, doing="show")
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None


def _open(data: bytes, source: str) -> Any:
    """``data`` decoded by Pillow, up to its pixel limit (``MAX_IMAGE_PIXELS``, 89.5 M
    pixels), where ``write --resize`` stops too: Pillow's own error comes at twice that,
    and a 13,000 px square RGBA PNG just under it took 2 GB to show."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():  # show is one thread: the filter is its own
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            image.load()
    except UnidentifiedImageError:
        raise InputError(
            f"{source}: expected an image Pillow reads, found {len(data):,} bytes starting "
            f"{data[:8]!r}"
        ) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise InputError(f"{source}: too large to show: {pillow_said(exc)}") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise InputError(
            f"{source}: expected an image Pillow reads, found {pillow_said(exc)}"
        ) from None
    return image
