"""Tell an image file by its first bytes: JPEG, PNG, GIF, BMP or WebP.

The writer refuses a file whose name says image (``.jpg``, ``.png``, ...)
but whose bytes start like none of these formats: a text file saved as
``.jpg`` would otherwise pass writing and stop training later inside
TensorFlow's decoder with an error that names no file. Any of the formats
is accepted under any image name: data sets hold PNGs named ``.jpg``, and
TensorFlow's ``decode_image`` (and ``decode_jpeg``) read them. The C loop in
``_native_frame.c`` (``known_image``) applies the same rule to the same bytes.

A JPEG or PNG whose bytes stop before the format's end (:func:`cut_short`) is
refused too: a copy or download cut short keeps a valid header, and
TensorFlow's decoders refuse the whole image (``tf.io.decode_image`` on a 96 px
JPEG, baseline and progressive, missing only its last 2 bytes, and on a PNG
missing only its 12-byte IEND chunk: each fails). So is a BMP of fewer than
8 bits a pixel, which TensorFlow refuses ("Number of channels ... was 0"), and
an animated WebP (:func:`animated_webp`): TensorFlow 2.21's ``decode_image``
aborts the whole process on one (``free(): corrupted unsorted chunks``, a
3-frame 16 px WebP from Pillow, in a fresh process), so training would die
naming nothing.
``image_refused`` in ``_native_imagehead.c`` reads the same bytes the same way.
"""

from __future__ import annotations

IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".webp")
HEAD_BYTES = 18  # what the longest check reads (BMP: its DIB header size at bytes 14-17)
SHOWN_BYTES = 8  # of a refused file, shown in the message
FORMATS = "JPEG, PNG, GIF, BMP or WebP"
_BMP_DIB_SIZES = (12, 16, 40, 52, 56, 64, 108, 124)  # every BITMAP*HEADER version


_ENDS = {"JPEG": "its end-of-image marker FF D9", "PNG": "its IEND chunk"}
_FEW_BITS = (
    "expected a BMP of 8, 24 or 32 bits a pixel, found fewer: TensorFlow's decoder refuses "
    "it (and aborted the process on one that came after other images); store it as a PNG"
)
_ANIMATED = (
    "expected a still image, found an animated WebP: TensorFlow's decode_image aborts the "
    "whole process on one (TensorFlow 2.21); store it as a still WebP, a PNG or a GIF"
)
_MAX_CHUNK = 2**31 - 1  # the PNG limit on a chunk's length


class NotAnImage(Exception):
    """A file named as an image holds none of the known formats, or (``refused``: its
    format) bytes TensorFlow's decoder refuses: a JPEG or PNG that stops before its end, an
    animated WebP; ``head`` is its start.
    """

    def __init__(self, head: bytes, refused: str = "") -> None:
        super().__init__(head)
        self.head = head
        self.refused = refused

    def problem(self, size: int) -> str:
        """The one-line problem of such a file of ``size`` bytes."""
        if not self.refused:
            return not_an_image(self.head)
        if self.refused == "WebP":
            return _ANIMATED
        if self.refused == "BMP":
            return _FEW_BITS
        return (
            f"expected a whole {self.refused} file (ending with {_ENDS[self.refused]}), found "
            f"{size:,} bytes that stop before it: the file was cut short (an interrupted copy "
            "or download?), and TensorFlow's decoder refuses it"
        )


def image_problem(data: bytes | memoryview) -> NotAnImage | None:
    """Why the bytes of a file named as an image are none, or ones TensorFlow refuses (see
    the module doc); None when neither."""
    fmt = image_format(data[:HEAD_BYTES])
    if fmt is None:
        return NotAnImage(bytes(data[:SHOWN_BYTES]))
    refused = (
        cut_short(data, fmt) or animated_webp(data) or (fmt == "BMP" and 0 < _bmp_bits(data) < 8)
    )
    return NotAnImage(bytes(data[:SHOWN_BYTES]), refused=fmt) if refused else None


def _bmp_bits(data: bytes | memoryview) -> int:
    """A BMP's bits a pixel (its DIB header's; an OS/2 header keeps them 4 bytes earlier)."""
    at = 24 if int.from_bytes(data[14:18], "little") == 12 else 28
    return int.from_bytes(data[at : at + 2], "little") if len(data) >= 30 else 0


def animated_webp(data: bytes | memoryview) -> bool:
    """Whether ``data`` is a WebP whose extended header (``VP8X``) has its animation flag."""
    head = bytes(data[:21])
    return (
        len(head) == 21
        and head[:4] == b"RIFF"
        and head[8:16] == b"WEBPVP8X"
        and bool(head[20] & 0x02)
    )


def cut_short(data: bytes | memoryview, fmt: str) -> bool:
    """True when JPEG or PNG bytes stop before the format's end (other formats: False).

    A JPEG's markers are walked to its first scan (SOS); past it only the
    end-of-image marker can be FF D9 (the scan data stuffs each FF with 00),
    so the last FF D9 at or after the scan means the image ends. A marker walk
    that meets other bytes than a marker is left to the decoder (not cut). A
    PNG's chunks are walked from its signature to the whole IEND chunk, CRC
    included (a PNG missing only its last byte fails to decode too). Bytes
    after the end are allowed: decoders ignore them.
    """
    if fmt == "JPEG":
        scan = _jpeg_scan(data)
        return scan is not None and (scan < 0 or bytes(data).rfind(b"\xff\xd9", scan) < 0)
    if fmt == "PNG":
        at, n = 8, len(data)
        while at + 8 <= n:
            length = int.from_bytes(data[at : at + 4], "big")
            if length > _MAX_CHUNK:
                return False  # not a PNG chunk: the decoder tells
            end = at + 12 + length  # length, type, data, CRC
            if data[at + 4 : at + 8] == b"IEND":
                return end > n  # the decoder reads its CRC too
            at = end
        return True
    return False


def _jpeg_scan(data: bytes | memoryview) -> int | None:
    """Where a JPEG's first SOS marker is; -1 when the bytes end first; None when a
    segment starts with other bytes than a marker."""
    at, n = 2, len(data)
    while at + 1 < n:
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
        elif marker == 0xDA:
            return at
        elif marker == 0x01 or 0xD0 <= marker <= 0xD8:  # no length follows
            at += 2
        elif marker == 0xD9:
            return None  # an end before any scan: no image, for the decoder to say
        elif at + 4 > n:
            return -1
        else:
            at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    return -1


def claims_image(path: str) -> bool:
    """True when ``path``'s suffix (any case) names an image format."""
    return path.lower().endswith(IMAGE_SUFFIXES)


def image_format(head: bytes | memoryview) -> str | None:
    """The format whose signature ``head`` (a file's first bytes) starts with, or None."""
    head = bytes(head[:HEAD_BYTES])
    if head[:3] == b"\xff\xd8\xff":
        return "JPEG"
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return "PNG"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    bmp = head[:2] == b"BM" and len(head) >= HEAD_BYTES
    if bmp and int.from_bytes(head[14:18], "little") in _BMP_DIB_SIZES:
        return "BMP"  # "BM" alone starts too many text files
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WebP"
    return None


def not_an_image(head: bytes) -> str:
    """The problem of a file named as an image whose first bytes are ``head``."""
    return (
        f"expected an image ({FORMATS}) as its name says, found bytes {bytes(head[:SHOWN_BYTES])!r}"
    )
