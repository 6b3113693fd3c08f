"""The EXIF orientation tag (0x0112) of a JPEG, PNG or WebP, read from its header bytes alone.

A JPEG's segments are walked up to the first scan (``SOS``), a PNG's chunks up
to the first ``IDAT``, a WebP's RIFF chunks to its ``EXIF`` chunk (which
follows the image data: the walk skips it by its size): no pixel is decoded,
and a file without an ``APP1`` ``Exif`` segment, an ``eXIf`` or an ``EXIF``
chunk costs a few segment headers. Only IFD0 is
read (where cameras put the tag). Anything malformed reads as 1 (upright),
which is what TensorFlow's decoders assume for every file.
"""

from __future__ import annotations

UPRIGHT = 1
TAG = 0x0112
_PNG = b"\x89PNG\r\n\x1a\n"
_SOS, _EOI = 0xDA, 0xD9
_APP1 = 0xE1
_EXIF = b"Exif\x00\x00"
_SHORT = 3


def orientation(data: bytes | memoryview) -> int:
    """The EXIF orientation (1..8) of the image in ``data``; 1 when it has none."""
    view = memoryview(data)
    if bytes(view[:3]) == b"\xff\xd8\xff":
        tiff = _jpeg_exif(view)
    elif bytes(view[:8]) == _PNG:
        tiff = _png_exif(view)
    elif bytes(view[:4]) == b"RIFF" and bytes(view[8:12]) == b"WEBP":
        tiff = _webp_exif(view)
    else:
        return UPRIGHT
    return UPRIGHT if tiff is None else tiff_orientation(tiff)


def _jpeg_exif(view: memoryview) -> memoryview | None:
    """The TIFF block of the first ``APP1 Exif`` segment before the first scan, or None."""
    at, size = 2, len(view)
    while at + 4 <= size:
        if view[at] != 0xFF:
            return None
        marker = view[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (_SOS, _EOI):
            return None
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:  # no length
            at += 2
            continue
        length = int.from_bytes(view[at + 2 : at + 4], "big")
        body = view[at + 4 : at + 2 + length]
        if marker == _APP1 and bytes(body[:6]) == _EXIF:
            return body[6:]
        at += 2 + length
    return None


def _png_exif(view: memoryview) -> memoryview | None:
    """The data of the first ``eXIf`` chunk before the first ``IDAT``, or None."""
    at, size = 8, len(view)
    while at + 8 <= size:
        length = int.from_bytes(view[at : at + 4], "big")
        kind = bytes(view[at + 4 : at + 8])
        if kind in (b"IDAT", b"IEND"):
            return None
        if kind == b"eXIf":
            return view[at + 8 : at + 8 + length]
        at += 12 + length
    return None


def _webp_exif(view: memoryview) -> memoryview | None:
    """The TIFF block of the first ``EXIF`` chunk (an ``Exif\0\0`` prefix, which some
    writers add, skipped), or None."""
    at, size = 12, len(view)
    while at + 8 <= size:
        length = int.from_bytes(view[at + 4 : at + 8], "little")
        if bytes(view[at : at + 4]) == b"EXIF":
            body = view[at + 8 : at + 8 + length]
            return body[6:] if bytes(body[:6]) == _EXIF else body
        at += 8 + length + (length & 1)  # chunks are padded to an even size
    return None


def tiff_orientation(tiff: bytes | memoryview) -> int:
    """The orientation tag of a TIFF block's IFD0 (an EXIF payload); 1 when absent or bad."""
    block = bytes(tiff)
    order = {b"II": "little", b"MM": "big"}.get(block[:2])
    if order is None or len(block) < 8:
        return UPRIGHT

    def num(at: int, width: int) -> int:
        return int.from_bytes(block[at : at + width], order)  # type: ignore[arg-type]

    if num(2, 2) != 42:
        return UPRIGHT
    ifd = num(4, 4)
    if ifd + 2 > len(block):
        return UPRIGHT
    for k in range(num(ifd, 2)):
        entry = ifd + 2 + 12 * k
        if entry + 12 > len(block):
            return UPRIGHT
        if num(entry, 2) == TAG:
            value = num(entry + 8, 2) if num(entry + 2, 2) == _SHORT else 0
            return value if 1 <= value <= 8 else UPRIGHT
    return UPRIGHT
