"""A 64-bit perceptual hash (DCT pHash) of each image: near-duplicates differ in few bits.

An image is decoded small and grey (a JPEG through Pillow's ``draft``: libjpeg
decodes the luma only, at 1/2..1/8 scale, to no less than 32 x 32 px), averaged
down to 32 x 32, and its 2-D DCT taken; the 8 x 8 lowest frequencies, each
against the median of the 63 beside the DC term, are the 64 bits (row-major,
the DC term's bit first). Re-encodes, resizes and small crops move few bits;
unrelated images differ in ~32.

A hash comes as a row of :data:`DTYPE`: the bits and ``ok`` (0: the payload did
not decode as an image, and its hash matches nothing).
"""

from __future__ import annotations

import io
from collections.abc import Iterable

import numpy as np

from tfshards.format import tfrecord
from tfshards.format.records import parse_records

SIDE = 32  # pixels a side of the grey thumbnail the DCT is taken of
LOW = 8  # frequencies a side kept: 64 bits
DTYPE = np.dtype([("hash", "<u8"), ("ok", "u1")])  # 9 bytes a record
_BATCH = 256  # thumbnails transformed at a time (a 256 x 32 x 32 float array: 2 MB)


def _dct_matrix(n: int) -> np.ndarray:
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    m = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * np.sqrt(2 / n)
    m[0] /= np.sqrt(2)
    out: np.ndarray = m[:LOW]  # only the low rows are ever used
    return out


_DCT = _dct_matrix(SIDE).astype(np.float32)
_WEIGHTS = (1 << np.arange(63, -1, -1, dtype=np.uint64)).astype(np.uint64)


def thumbnail(data: bytes | memoryview) -> np.ndarray | None:
    """The 32 x 32 grey thumbnail of an image (float32), or None when it does not decode."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.draft("L", (SIDE, SIDE))
            grey = image.convert("L")
            small = grey.resize((SIDE, SIDE), Image.Resampling.BOX)
            return np.asarray(small, dtype=np.float32)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None


def hashes(thumbnails: np.ndarray) -> np.ndarray:
    """The 64-bit hashes (uint64) of ``n`` thumbnails (an ``n x 32 x 32`` array)."""
    low = np.matmul(np.matmul(_DCT, thumbnails), _DCT.T).reshape(-1, 64)
    median = np.median(low[:, 1:], axis=1, keepdims=True)
    bits = (low > median).astype(np.uint64)
    out: np.ndarray = (bits * _WEIGHTS).sum(axis=1, dtype=np.uint64)
    return out


def image_hashes(payloads: Iterable[bytes | memoryview | None]) -> np.ndarray:
    """A :data:`DTYPE` row for each payload (None: not an image), in order."""
    rows: list[np.ndarray] = []
    pending: list[np.ndarray | None] = []

    def flush() -> None:
        found = [t for t in pending if t is not None]
        bits = hashes(np.stack(found)) if found else np.zeros(0, np.uint64)
        out = np.zeros(len(pending), DTYPE)
        ok = np.array([t is not None for t in pending], dtype=bool)
        out["hash"][ok] = bits
        out["ok"][ok] = 1
        rows.append(out)
        pending.clear()

    for payload in payloads:
        pending.append(None if payload is None else thumbnail(payload))
        if len(pending) == _BATCH:
            flush()
    if pending:
        flush()
    return np.concatenate(rows) if rows else np.zeros(0, DTYPE)


def shard_hashes(data: bytes, compression: str, image_feature: str) -> bytes:
    """The :data:`DTYPE` rows of a shard's records (its bytes as stored), in record order."""
    buf = tfrecord.decompress(data, compression)
    payloads = (
        (p.fields[image_feature].first if p.fields and image_feature in p.fields else None)
        for p in parse_records(buf, [image_feature])
        if p.data is not None
    )
    return image_hashes(payloads).tobytes()


def distance(a: int, b: int) -> int:
    """Bits that differ between two hashes."""
    return (a ^ b).bit_count()
