"""Is this file the shard its manifest entry describes? Size, sha256, framing, record count.

The one check, and the one wording of each way a file can differ, for every
reader of shard files: validation (:mod:`tfshards.validation.shardcheck`),
the loader's gate (:mod:`tfshards.reading.gate`) and the verified cache
(:mod:`tfshards.reading.cache`). :func:`read` takes a file once in pieces
(bounded memory): it hashes them, inflates a gzip/zlib stream piece by piece
and walks the framing (every length and length CRC, every record inside the
stream) up to its first problem; :func:`mismatches` lists how what it found
differs from the entry, in the order every caller reports them. Data CRCs and
record contents are the callers' own checks.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from tfshards.format.tfrecord import FrameCounter, inflate
from tfshards.shardset.manifest import ShardInfo

READ_BYTES = 4 << 20  # read, hashed and walked at a time


class Mismatch(NamedTuple):
    """One way a file is not its shard; ``index``/``offset``: the record where its framing broke."""

    what: str
    index: int | None = None  # type: ignore[assignment]  # shadows tuple.index: record number
    offset: int | None = None


def missing(shard: ShardInfo) -> str:
    return f"missing: expected {shard.bytes} bytes holding {shard.records} records"


def size_mismatch(shard: ShardInfo, size: int) -> str:
    return f"size mismatch: expected {shard.bytes} bytes, found {size}"


def sha256_mismatch(shard: ShardInfo, sha256: str) -> str:
    return f"sha256 mismatch: expected {shard.sha256}, found {sha256}"


def count_mismatch(shard: ShardInfo, records: int) -> str:
    return f"record count mismatch: expected {shard.records}, found {records}"


def cannot_decompress(compression: str, error: str) -> str:
    return f"cannot decompress ({compression}): {error}"


def bytes_mismatches(shard: ShardInfo, size: int, sha256: str | None) -> list[Mismatch]:
    """Size and sha256 against the entry (``sha256`` None: not hashed, not compared)."""
    out = []
    if size != shard.bytes:
        out.append(Mismatch(size_mismatch(shard, size)))
    if sha256 is not None and sha256 != shard.sha256:
        out.append(Mismatch(sha256_mismatch(shard, sha256)))
    return out


@dataclass
class Found:
    """What :func:`read` found: bytes read, their sha256 (None: not hashed), the framing walk.

    ``inflate_error``: why the stream does not inflate (None: it does, or is
    not compressed); ``records`` is then unknown.
    """

    size: int
    sha256: str | None
    walk: FrameCounter
    compression: str
    inflate_error: str | None = None

    @property
    def records(self) -> int | None:
        """Records the walk found (up to its problem); None where the stream does not inflate."""
        return None if self.inflate_error is not None else self.walk.records


def read(
    pieces: Iterable[bytes], compression: str, *, hashed: bool = True, chunk_bytes: int = 0
) -> Found:
    """Hash the file given in ``pieces``, and walk the framing of its (inflated) stream.

    The walk stops at its first problem (nothing after it can be trusted; a
    bomb is not inflated further); the rest of the file is still read and
    hashed. ``chunk_bytes``: the walk's record-aligned cuts
    (:class:`~tfshards.format.tfrecord.FrameCounter`).
    """
    digest = hashlib.sha256()
    size = 0

    def counted() -> Iterator[bytes]:
        nonlocal size
        for piece in pieces:
            size += len(piece)
            if hashed:
                digest.update(piece)
            yield piece

    raw = counted()
    walk = FrameCounter(chunk_bytes)
    error = None
    try:
        for piece in raw if compression == "none" else inflate(raw, compression):
            walk.feed(piece)
            if walk.problem is not None:
                break
        else:
            walk.finish()
    except zlib.error as exc:
        error = str(exc)
    for _ in raw:
        pass  # read (and hash) the rest
    return Found(size, digest.hexdigest() if hashed else None, walk, compression, error)


def read_file(path: str, compression: str, *, hashed: bool = True, chunk_bytes: int = 0) -> Found:
    """:func:`read` of the local file ``path``, ``READ_BYTES`` at a time."""

    def pieces() -> Iterator[bytes]:
        with open(path, "rb", buffering=0) as f:  # local by construction
            while chunk := f.read(READ_BYTES):
                yield chunk

    return read(pieces(), compression, hashed=hashed, chunk_bytes=chunk_bytes)


def framing_mismatch(found: Found) -> Mismatch | None:
    """Why the stream cannot be read to its end: it does not inflate, or its framing breaks."""
    if found.inflate_error is not None:
        return Mismatch(cannot_decompress(found.compression, found.inflate_error))
    walk = found.walk
    if walk.problem is not None:
        return Mismatch(walk.problem, walk.records, walk.offset)
    return None


def mismatches(shard: ShardInfo, found: Found) -> list[Mismatch]:
    """Every way the file :func:`read` found differs from ``shard``, in the order reported.

    Size, sha256, the stream (inflate or framing), then the record count
    (unknown, so not compared, where the stream does not inflate).
    """
    out = bytes_mismatches(shard, found.size, found.sha256)
    broken = framing_mismatch(found)
    if broken is not None:
        out.append(broken)
    if found.records is not None and found.records != shard.records:
        out.append(Mismatch(count_mismatch(shard, found.records)))
    return out
