"""Frame TFRecords in place in one reusable buffer: the shard writer's hot path.

A raw file's bytes are read straight into their final place inside a framed
``tf.train.Example`` (the lengths of everything around them are known from the
listing before the read), hashed there, and leave in ~1 MB writes. Nothing is
allocated or copied per record except the few header bytes: on 72 KB files a
fresh ``bytes`` per read plus joining the record cost more than the hashing.

Layout of one record of the base features (keys in sorted order; ``image`` is
the configurable payload feature), as :func:`tfshards.format.example.encode_around`
lays out the Example around the payload::

    uint64 L | masked crc(L) | 0x0a varint(body) | entries... | masked crc(data)
                               '-------------- data (L bytes) ---------------'
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, cast

from tfshards import storage
from tfshards.format import native
from tfshards.format.example import encode_around
from tfshards.format.imageformat import (
    SHOWN_BYTES,
    NotAnImage,
    claims_image,
    image_problem,
)
from tfshards.format.imageheader import NATIVE_FORMATS
from tfshards.format.schema import Values
from tfshards.format.tfrecord import crc32c, header, mask
from tfshards.format.wire import CRC, FOOTER_BYTES, HEADER_BYTES, Dtype

FLUSH_BYTES = 1 << 20  # 1 MB writes: a fresh worker faults in fewer pages than with 4 MB
DIGEST_BYTES = 64  # the ``sha256`` feature: hex digest of the payload

Flush = Callable[[memoryview], None]
ReadInto = Callable[[memoryview, Any], int]  # (view, source) -> bytes the file holds


class Entry(Protocol):
    """A listed file as the buffer reads it (the listing's row: ``tfshards.listing.entry``)."""

    @property
    def path(self) -> str: ...  # relative to the root
    @property
    def size(self) -> int: ...  # listed size
    @property
    def label(self) -> int: ...


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
# A frame's header by record length: the lengths of a data set recur across its shards.
_header = functools.lru_cache(maxsize=1 << 16)(header)


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
        # The sha256 value among add_file's pieces: filled in after the payload is hashed.
        self._digest = bytearray(DIGEST_BYTES)
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
            for i, e in enumerate(entries):
                rel, label, size = e.path, e.label, e.size
                want = expected[32 * i : 32 * i + 32] if expected else None
                try:
                    self.add_file(
                        size, label, rel.encode(), read_local_into, prefix + rel, want,
                        claims_image(rel),
                    )  # fmt: skip
                except (OSError, FileChanged, ContentChanged, NotAnImage) as exc:
                    yield i, exc
            return
        rels = [e.path.encode() for e in entries]
        labels = [e.label for e in entries]
        sizes = [e.size for e in entries]
        frame, i, count = c.frame_files, 0, len(entries)
        images = bytes(claims_image(e.path) for e in entries)
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
            NotAnImage: ``check_image`` is set and the bytes are no known image format,
                or a JPEG or PNG cut short.
        """
        digest = self._digest
        base: dict[str, tuple[Dtype, Values]] = {
            "label": ("int64", [label]),
            "path": ("bytes", [path]),
            "sha256": ("bytes", [cast(bytes, digest)]),  # filled in below, then joined
        }
        before, after, offset, length = encode_around(base, self.image_feature, size)
        total = HEADER_BYTES + length + FOOTER_BYTES
        if self._used + total + 1 > len(self._buf):
            self._make_room(total)
        view, at = self._view, self._used
        start = at + HEADER_BYTES + offset

        got = read_into(view[start : start + size + 1], source)
        if got != size or got == 0:
            raise FileChanged(got)
        sha = hashlib.sha256(view[start : start + size])
        if expected and expected != _UNCHECKED and sha.digest() != expected:
            raise ContentChanged(expected, sha.digest())
        if check_image and (problem := image_problem(view[start : start + size])) is not None:
            raise problem
        digest[:] = sha.hexdigest().encode()  # in ``before`` or ``after``, as its key sorts
        end = at + HEADER_BYTES + length
        view[at:start] = b"".join([_header(length), *before])
        view[start + size : end] = b"".join(after)
        CRC.pack_into(view, end, mask(crc32c(view[at + HEADER_BYTES : end])))
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
    none (-4), or the format code of bytes TensorFlow refuses (-5: a JPEG or PNG cut
    short, an animated WebP).
    """
    if error > 0:
        return OSError(error, os.strerror(error))
    if error == -4:
        return NotAnImage(found.to_bytes(8, "little", signed=True)[: min(size, SHOWN_BYTES)])
    if error == -5:
        return NotAnImage(b"", refused=NATIVE_FORMATS[found])
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
