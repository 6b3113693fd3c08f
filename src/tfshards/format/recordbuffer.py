"""Frame TFRecords in place in one reusable buffer: the shard writer's hot path.

A raw file's bytes are read straight into their final place inside a framed
``tf.train.Example`` (the lengths of everything around them are known from the
listing before the read), hashed there, and leave in ~1 MB writes. Nothing is
allocated or copied per record except the few header bytes: on 72 KB files a
fresh ``bytes`` per read plus joining the record cost more than the hashing.

Layout of one record of the base features (keys in sorted order; ``image`` is
the configurable payload feature)::

    uint64 L | masked crc(L) | 0x0a varint(body) | entries... | masked crc(data)
                               '-------------- data (L bytes) ---------------'
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import crc32c

from tfshards import storage
from tfshards.format import native
from tfshards.format.example import bytes_entry_head, int64_entry, varint
from tfshards.format.imageformat import (
    HEAD_BYTES,
    SHOWN_BYTES,
    NotAnImage,
    claims_image,
    image_format,
)
from tfshards.format.tfrecord import header, mask
from tfshards.format.wire import CRC, FOOTER_BYTES, HEADER_BYTES, TAG1
from tfshards.listing.entry import Entry

FLUSH_BYTES = 1 << 20  # 1 MB writes: a fresh worker faults in fewer pages than with 4 MB
DIGEST_BYTES = 64  # the ``sha256`` feature: hex digest of the payload

Flush = Callable[[memoryview], None]
ReadInto = Callable[[memoryview, Any], int]  # (view, source) -> bytes the file holds


class FileChanged(Exception):
    """The file's size differs from the listed one (``found`` is the current size)."""

    def __init__(self, found: int) -> None:
        super().__init__(found)
        self.found = found


class ContentChanged(Exception):
    """The file's bytes are not the listed ones: same size, other SHA-256 (raw digests)."""

    def __init__(self, expected: bytes, found: bytes) -> None:
        super().__init__(expected, found)
        self.expected, self.found = expected, found


Problem = OSError | FileChanged | ContentChanged | NotAnImage
_UNCHECKED = bytes(32)  # an expected digest of zeros: nothing to compare with


class _Table(dict[int, bytes]):
    """Byte strings by length, each computed once per process (at most ``_TABLE_SIZE`` kept).

    A record's headers depend only on a few lengths, and the same lengths
    recur across shards: a lookup (~30 ns) replaces building them (~1 us).
    """

    def __init__(self, make: Callable[[int], bytes]) -> None:
        super().__init__()
        self.make = make

    def __missing__(self, n: int) -> bytes:
        value = self.make(n)
        if len(self) < _TABLE_SIZE:
            self[n] = value
        return value


def _lead(body: int) -> bytes:
    """TFRecord header + Example tag and length, for an Example of ``body`` entry bytes."""
    example_head = bytes([TAG1]) + varint(body)
    return header(len(example_head) + body) + example_head


_TABLE_SIZE = 1 << 16  # per table: every size of a typical data set; at most a few MB
_LEADS = _Table(_lead)
_LABELS = _Table(functools.partial(int64_entry, "label"))
_PATH_HEADS = _Table(functools.partial(bytes_entry_head, "path"))
_IMAGE_HEADS: dict[str, _Table] = {}


class RecordBuffer:
    """Framed records gathered in one buffer, handed to ``flush`` whenever it fills.

    ``flush`` gets a view of the buffer that is valid only during the call: it
    must hash, compress or write it before returning. ``image_feature`` names
    the payload feature of the records :meth:`add_file` lays out.
    """

    def __init__(self, flush: Flush, image_feature: str, capacity: int = FLUSH_BYTES) -> None:
        self._flush = flush
        self._buf = bytearray(capacity)
        self._view = memoryview(self._buf)
        self._used = 0
        self.image_feature = image_feature
        # label, path, sha256 (their sorted order): which precede the payload's key?
        self._before = tuple(k < image_feature for k in ("label", "path", "sha256"))
        self._payload_first = not any(self._before)  # the default, "image"
        self._sha_head = bytes_entry_head("sha256", DIGEST_BYTES)
        self._sha_len = len(self._sha_head) + DIGEST_BYTES
        self._image_heads = _IMAGE_HEADS.setdefault(
            image_feature, _Table(functools.partial(bytes_entry_head, image_feature))
        )
        # For the C loop: the four keys in sorted order, and what each holds.
        roles = {image_feature: "p", "label": "l", "path": "n", "sha256": "s"}
        self._keys = tuple(k.encode() for k in sorted(roles))
        self._roles = "".join(roles[k] for k in sorted(roles))

    def add_local_files(
        self, prefix: str, entries: Sequence[Entry], expected: bytes | None = None
    ) -> Iterator[tuple[int, Problem]]:
        """Frame the local files ``prefix + path`` of ``entries``, in order.

        Yields ``(index, problem)`` for each file that cannot be read, does
        not hold its listed size, (with ``expected``: 32 bytes of SHA-256
        per entry, zeros for none) holds other bytes than listed, or is named
        as an image but holds none of the known formats
        (:mod:`tfshards.format.imageformat`), and goes on with the next one when
        resumed. One C call frames a whole buffer's
        worth of files when :mod:`tfshards.format.native` is built; else one
        :meth:`add_file` each.
        """
        c = native.NATIVE
        try:
            dir_fd = -1 if c is None else os.open(prefix, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:  # each file's own error tells more than the folder's
            dir_fd = -1
        if c is None or dir_fd < 0:
            for i, (rel, size, label, _) in enumerate(entries):
                want = expected[32 * i : 32 * i + 32] if expected else None
                try:
                    self.add_file(
                        size, label, rel.encode(), read_local_into, prefix + rel, want,
                        claims_image(rel),
                    )  # fmt: skip
                except (OSError, FileChanged, ContentChanged, NotAnImage) as exc:
                    yield i, exc
            return
        rels = [e[0].encode() for e in entries]
        labels = [e.label for e in entries]
        sizes = [e.size for e in entries]
        frame, i, count = c.frame_files, 0, len(entries)
        images = bytes(claims_image(e[0]) for e in entries)
        checks = (bytes(32 * count) if expected is None else expected, images)
        try:
            while i < count:
                i, self._used, error, found = frame(
                    self._buf,
                    self._used,
                    dir_fd,
                    rels,
                    labels,
                    sizes,
                    i,
                    self._keys,
                    self._roles,
                    *checks,
                )
                if error:
                    yield i, _problem(error, found, expected, i, sizes[i])
                    i += 1
                elif i < count:  # record ``i`` does not fit: flush, or grow for it
                    if self._used:
                        self.flush()
                    else:  # at least double: a record's keys and lengths can outgrow any margin
                        self._grow(max(2 * len(self._buf), sizes[i] + len(rels[i]) + 4096))
        finally:
            os.close(dir_fd)

    def add_file(
        self,
        size: int,
        label: int,
        path: bytes,
        read_into: ReadInto,
        source: Any,
        expected: bytes | None = None,
        check_image: bool = False,
    ) -> None:
        """Frame one file of ``size`` listed bytes as an Example of the base features.

        ``read_into(view, source)`` fills ``view`` (one byte longer than
        ``size``, so a file that grew shows) and returns the file's size.

        Raises:
            FileChanged: the file is empty or does not hold exactly ``size`` bytes.
            ContentChanged: its SHA-256 is not ``expected`` (raw; None or zeros: unchecked).
            NotAnImage: ``check_image`` is set and the bytes are no known image format.
        """
        image_head = self._image_heads[size]
        label_entry = _LABELS[label]
        path_head = _PATH_HEADS[len(path)]
        path_len = len(path_head) + len(path)
        body = len(image_head) + size + len(label_entry) + path_len + self._sha_len
        lead = _LEADS[body]  # the frame's header, then the Example's tag and length
        length = len(lead) - HEADER_BYTES + body
        total = HEADER_BYTES + length + FOOTER_BYTES
        if self._used + total + 1 > len(self._buf):
            self._make_room(total)
        view, at = self._view, self._used
        start = at + len(lead) + len(image_head)
        if not self._payload_first:
            lengths = (len(label_entry), path_len, self._sha_len)
            start += sum(n for n, b in zip(lengths, self._before, strict=True) if b)

        got = read_into(view[start : start + size + 1], source)
        if got != size or got == 0:
            raise FileChanged(got)
        sha = hashlib.sha256(view[start : start + size])
        if expected and expected != _UNCHECKED and sha.digest() != expected:
            raise ContentChanged(expected, sha.digest())
        if check_image and image_format(view[start : start + min(size, HEAD_BYTES)]) is None:
            raise NotAnImage(bytes(view[start : start + min(size, SHOWN_BYTES)]))
        digest = sha.hexdigest().encode()
        end = at + HEADER_BYTES + length
        if self._payload_first:
            view[at:start] = lead + image_head
            view[start + size : end] = b"".join(
                (label_entry, path_head, path, self._sha_head, digest)
            )
        else:
            entries = (label_entry, path_head + path, self._sha_head + digest)
            pre = [e for e, b in zip(entries, self._before, strict=True) if b]
            post = [e for e, b in zip(entries, self._before, strict=True) if not b]
            view[at:start] = b"".join([lead, *pre, image_head])
            view[start + size : end] = b"".join(post)
        CRC.pack_into(view, end, mask(crc32c.crc32c(view[at + HEADER_BYTES : end])))
        self._used = end + FOOTER_BYTES

    def append(self, pieces: Sequence[bytes | memoryview]) -> None:
        """Copy an already encoded and framed record in."""
        total = sum(len(p) for p in pieces)
        if self._used + total + 1 > len(self._buf):
            self._make_room(total)
        at = self._used
        for piece in pieces:
            self._view[at : at + len(piece)] = piece
            at += len(piece)
        self._used = at

    def flush(self) -> None:
        if self._used:
            self._flush(self._view[: self._used])
            self._used = 0

    def _make_room(self, nbytes: int) -> None:
        """Flush; and grow the buffer for a record larger than it (+1 spare byte)."""
        self.flush()
        if nbytes + 1 > len(self._buf):
            self._grow(nbytes + 1)

    def _grow(self, capacity: int) -> None:
        self._view.release()
        self._buf = bytearray(capacity)
        self._view = memoryview(self._buf)


def _problem(error: int, found: Any, expected: bytes | None, i: int, size: int) -> Problem:
    """The exception for what ``frame_files`` reported about item ``i`` (``size`` bytes listed).

    An errno (> 0), a size (-1), a digest (-2), a file type (-3, ``st_mode``)
    or the first 8 bytes, little-endian, of a file named as an image that is
    none (-4).
    """
    if error > 0:
        return OSError(error, os.strerror(error))
    if error == -4:
        return NotAnImage(found.to_bytes(8, "little", signed=True)[: min(size, SHOWN_BYTES)])
    if error == -3:
        return storage.not_a_file(found)
    if error == -2 and expected is not None:
        return ContentChanged(expected[32 * i : 32 * i + 32], bytes(found))
    return FileChanged(found)


def read_local_into(view: memoryview, path: str) -> int:
    """:data:`ReadInto` for a local file: reads until ``view`` is full or the file ends."""
    fd = storage.open_regular(path)  # a FIFO would block the read forever
    try:
        got = os.readv(fd, [view])
        while got < len(view) - 1:  # short of the listed size: the end, or a piecemeal filesystem
            n = os.readv(fd, [view[got:]])
            if n == 0:
                break
            got += n
        if got == len(view):  # more than the view holds: report the size it has now
            return os.fstat(fd).st_size
        return got
    finally:
        os.close(fd)


def copy_into(view: memoryview, data: bytes) -> int:
    """:data:`ReadInto` for bytes already fetched (remote storage)."""
    n = min(len(data), len(view))
    view[:n] = data[:n]
    return len(data)
