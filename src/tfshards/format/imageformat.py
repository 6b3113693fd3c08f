"""Tell an image file by its first bytes: JPEG, PNG, GIF, BMP or WebP.

The writer refuses a file whose name says image (``.jpg``, ``.png``, ...)
but whose bytes start like none of these formats: a text file saved as
``.jpg`` would otherwise pass writing and stop training later inside
TensorFlow's decoder with an error that names no file. Any of the formats
is accepted under any image name: data sets hold PNGs named ``.jpg``, and
TensorFlow's ``decode_image`` (and ``decode_jpeg``) read them. The C loop in
``_native_frame.c`` (``known_image``) applies the same rule to the same bytes.
"""

from __future__ import annotations

IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".webp")
HEAD_BYTES = 18  # what the longest check reads (BMP: its DIB header size at bytes 14-17)
SHOWN_BYTES = 8  # of a refused file, shown in the message
FORMATS = "JPEG, PNG, GIF, BMP or WebP"
_BMP_DIB_SIZES = (12, 16, 40, 52, 56, 64, 108, 124)  # every BITMAP*HEADER version


class NotAnImage(Exception):
    """A file named as an image holds none of the known formats; ``head`` is its start."""

    def __init__(self, head: bytes) -> None:
        super().__init__(head)
        self.head = head


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
