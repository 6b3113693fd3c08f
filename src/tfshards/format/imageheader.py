"""An image's width, height and channels from its header bytes alone, without decoding it.

JPEG (its SOF segment), PNG (IHDR), GIF (the logical screen), BMP (the DIB
header) and WebP (VP8, VP8L or VP8X). Where the header cannot tell (a
format none of these, a JPEG cut before its SOF), the sizes are 0 and the
format is :data:`UNKNOWN` when the bytes are none of these formats.
Channels are what TensorFlow's decoder gives without conversion: a palette
PNG decodes to RGB (3), or RGBA (4) with a tRNS chunk; a PNG with an alpha
channel to 4; an 8-bit BMP to grey (1: its palette ignored), and one of fewer
bits not at all (0). One exception, on purpose: a CMYK JPEG counts its 4
components (TensorFlow gives 3, converted), so the non-RGB gate sees it. The C loop
``image_headers`` (``_native_imagehead.c``) reads the same bytes the same way.
"""

from __future__ import annotations

from typing import NamedTuple

from tfshards.format.imageformat import image_format

UNKNOWN = "unknown"
# The format codes of the C loop (``image_headers`` in ``_native_imagehead.c``), in order.
NATIVE_FORMATS = (UNKNOWN, "JPEG", "PNG", "GIF", "BMP", "WebP")
# JPEG start-of-frame markers: C0-CF except DHT (C4), JPG (C8) and DAC (CC).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_STANDALONE = frozenset((0x01, *range(0xD0, 0xD9)))  # TEM, RSTn, SOI: no length follows
_PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}  # by IHDR colour type
_PALETTE = 3  # the IHDR colour type of a palette PNG: RGBA when it has a tRNS chunk
# By bits per pixel, as TensorFlow's BMP decoder gives them: 8 is grey (the palette
# ignored), below 8 it refuses (0: no channels to count).
_BMP_CHANNELS = {32: 4, 24: 3, 8: 1}


class Header(NamedTuple):
    """What a header tells; 0 where it does not."""

    format: str
    width: int
    height: int
    channels: int


def read_header(data: bytes | memoryview) -> Header:
    """The format, width, height and channels ``data`` (a whole file, or its start) declares."""
    fmt = image_format(data)
    if fmt is None:
        return Header(UNKNOWN, 0, 0, 0)
    head = bytes(data[: 64 if fmt != "JPEG" else 0])
    try:
        if fmt == "JPEG":
            return _jpeg(data)
        if fmt == "PNG":
            return _png(head, data)
        if fmt == "GIF":
            w, h = int.from_bytes(head[6:8], "little"), int.from_bytes(head[8:10], "little")
            return Header("GIF", w, h, 3) if len(head) >= 10 else Header("GIF", 0, 0, 0)
        if fmt == "BMP":
            return _bmp(head)
        return _webp(head)
    except IndexError:  # cut short
        return Header(fmt, 0, 0, 0)


def _jpeg(data: bytes | memoryview) -> Header:
    """Walk the marker segments to the first SOF: its height, width and components."""
    n, at = len(data), 2
    while at + 1 < n:
        if data[at] != 0xFF:
            break  # not a marker where one must be: the header cannot tell
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in _STANDALONE:
            at += 2
            continue
        if marker in _SOF:
            if at + 10 > n:
                break
            h = data[at + 5] << 8 | data[at + 6]
            w = data[at + 7] << 8 | data[at + 8]
            return Header("JPEG", w, h, data[at + 9])
        if marker == 0xDA or at + 4 > n:  # scan data before any frame header
            break
        at += 2 + (data[at + 2] << 8 | data[at + 3])
    return Header("JPEG", 0, 0, 0)


def _png(head: bytes, data: bytes | memoryview) -> Header:
    if len(head) < 26 or head[12:16] != b"IHDR":
        return Header("PNG", 0, 0, 0)
    w, h = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    channels = _PNG_CHANNELS.get(head[25], 0)
    if head[25] == _PALETTE and _has_trns(data):  # TensorFlow gives its alpha: RGBA
        channels = 4
    return Header("PNG", w, h, channels)


def _has_trns(data: bytes | memoryview) -> bool:
    """Whether a PNG's chunks before its image data hold a tRNS chunk (a palette's alpha)."""
    at, n = 8, len(data)
    while at + 8 <= n:
        kind = bytes(data[at + 4 : at + 8])
        if kind in (b"IDAT", b"IEND"):
            return False
        if kind == b"tRNS":
            return True
        at += 12 + int.from_bytes(data[at : at + 4], "big")
    return False


def _bmp(head: bytes) -> Header:
    dib = int.from_bytes(head[14:18], "little")
    if dib == 12:  # OS/2 BITMAPCOREHEADER: 16-bit sizes
        w, h, bpp = (int.from_bytes(head[a:b], "little") for a, b in ((18, 20), (20, 22), (24, 26)))
    else:
        w = int.from_bytes(head[18:22], "little", signed=True)
        h = int.from_bytes(head[22:26], "little", signed=True)  # negative: rows top-down
        bpp = int.from_bytes(head[28:30], "little")
    if len(head) < 30:
        return Header("BMP", 0, 0, 0)
    return Header("BMP", abs(w), abs(h), _BMP_CHANNELS.get(bpp, 3 if bpp > 8 else 0))


def _webp(head: bytes) -> Header:
    chunk = head[12:16]
    if chunk == b"VP8 " and len(head) >= 30 and head[23:26] == b"\x9d\x01\x2a":
        w = int.from_bytes(head[26:28], "little") & 0x3FFF
        h = int.from_bytes(head[28:30], "little") & 0x3FFF
        return Header("WebP", w, h, 3)
    if chunk == b"VP8L" and len(head) >= 25 and head[20] == 0x2F:
        bits = int.from_bytes(head[21:25], "little")
        alpha = bits >> 28 & 1
        return Header("WebP", (bits & 0x3FFF) + 1, (bits >> 14 & 0x3FFF) + 1, 4 if alpha else 3)
    if chunk == b"VP8X" and len(head) >= 30:
        alpha = head[20] & 0x10
        w = int.from_bytes(head[24:27], "little") + 1
        h = int.from_bytes(head[27:30], "little") + 1
        return Header("WebP", w, h, 4 if alpha else 3)
    return Header("WebP", 0, 0, 0)
