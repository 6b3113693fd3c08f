"""Count the stored images that carry an EXIF orientation other than 1, per side of the split.

TensorFlow's decoders ignore the tag, so such a record reaches the model
turned or mirrored (``write.exif: apply`` stores them upright: then none is
counted). The shards are streamed once more for it, a megabyte at a time:
of each record only its first :data:`HEAD` bytes are kept, its image payload
found in them by walking the Example's fields, and the payload's header read
(:mod:`tfshards.format.exif`), never its pixels. A record whose image starts
past :data:`HEAD`, or that does not parse, counts as upright (the shard checks
report what is wrong with it).
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Iterable, Iterator
from typing import Any

from tfshards import storage
from tfshards.format import exif, tfrecord
from tfshards.format.wire import FOOTER_BYTES, HEADER_BYTES
from tfshards.shardset.manifest import Manifest

HEAD = 1 << 16  # bytes kept of each record: an Example's image payload and its EXIF block
READ_CHUNK = 1 << 20


class _Stream:
    """Bytes handed out from an iterator of chunks: taken, or skipped without being kept."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks: Iterator[bytes] = iter(chunks)
        self.buf, self.pos = b"", 0

    def _walk(self, n: int, keep: list[bytes] | None) -> int:
        left = n
        while left > 0:
            if self.pos >= len(self.buf):
                self.buf, self.pos = next(self.chunks, b""), 0
                if not self.buf:
                    break
            piece = self.buf[self.pos : self.pos + left]
            self.pos += len(piece)
            left -= len(piece)
            if keep is not None:
                keep.append(piece)
        return n - left

    def take(self, n: int) -> bytes:
        kept: list[bytes] = []
        self._walk(n, kept)
        return b"".join(kept)

    def skip(self, n: int) -> int:
        return self._walk(n, None)


def record_heads(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The first :data:`HEAD` bytes of each record's data in an uncompressed TFRecord stream."""
    stream = _Stream(chunks)
    while len(header := stream.take(HEADER_BYTES)) == HEADER_BYTES:
        length = int.from_bytes(header[:8], "little")
        head = stream.take(min(length, HEAD))
        yield head
        if stream.skip(length - len(head) + FOOTER_BYTES) < length - len(head) + FOOTER_BYTES:
            return


def _varint(buf: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(buf) or shift > 63:
            raise IndexError(at)
        byte = buf[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def _messages(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(field number, start, end) of each length-delimited field in ``buf[start:end]``."""
    at = start
    while at < end:
        tag, at = _varint(buf, at)
        if tag & 7 != 2:
            return  # an Example's fields down to the payload are all length-delimited
        length, at = _varint(buf, at)
        yield tag >> 3, at, at + length
        at += length


def image_payload(head: bytes, feature: str) -> bytes | None:
    """The bytes value of feature ``feature`` in a record's head (cut at its end), or None."""
    key = feature.encode()
    try:
        for number, a, b in _messages(head, 0, len(head)):  # Example.features
            for entry, c, d in _messages(head, a, b) if number == 1 else ():  # map entries
                fields = {n: (s, e) for n, s, e in _messages(head, c, d)} if entry == 1 else {}
                if 1 not in fields or head[slice(*fields[1])] != key or 2 not in fields:
                    continue
                for kind, e, f in _messages(head, *fields[2]):  # Feature
                    for value, g, h in _messages(head, e, f) if kind == 1 else ():  # BytesList
                        return head[g:h] if value == 1 else None
                return None
    except IndexError:
        return None
    return None


def rotated_in_shard(chunks: Iterable[bytes], compression: str, image_feature: str) -> int:
    """Records of one shard (its stored bytes, in pieces) whose orientation is 2..8."""
    stream = chunks if compression == "none" else tfrecord.inflate(chunks, compression)
    count = 0
    for head in record_heads(stream):
        payload = image_payload(head, image_feature)
        if payload is not None:
            count += exif.orientation(payload) != exif.UPRIGHT
    return count


def _chunks(f: Any) -> Iterator[bytes]:
    while chunk := f.read(READ_CHUNK):
        yield chunk


def rotated_per_side(
    fs: Any, root: str, manifest: Manifest, val: Collection[str], sound: Collection[str]
) -> dict[str, int]:
    """``{"train": n, "val": m}``: rotated records on each side, of the ``sound`` shards.

    A shard the checks found a problem in (a gzip bomb, a record too large to
    hold) is not read again: it counts 0.
    """
    feature = str(manifest.params.get("image_feature", "image"))
    out = {"train": 0, "val": 0}
    for shard in (s for s in manifest.shards if s.name in sound):
        try:
            with fs.open(storage.join(root, shard.name), "rb") as f:
                found = rotated_in_shard(_chunks(f), manifest.compression, feature)
        except (OSError, ValueError, zlib.error):  # the shard checks report what is wrong
            continue
        out["val" if shard.name in val else "train"] += found
    return out
