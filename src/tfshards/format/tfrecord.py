"""TFRecord framing: write records, and walk them back checking both CRCs.

The layout is in :mod:`tfshards.format.wire`. This is the reference walk:
:func:`scan` (a buffer) and :class:`FrameCounter` (a stream in pieces) read
each header with :func:`read_header` and word every problem here; the C walk
(``scan_frames`` in ``_native_scan.c``) stops where they find one. This module
needs no TensorFlow. CRCs use the hardware-accelerated ``crc32c``
package (~20 GB/s here), so framing costs far less than hashing the payload.
It is imported on first use: importing it takes ~26 ms (it pulls in
``importlib.metadata`` and ``argparse``), and a command whose C loops frame
and check every record (validate's start) never calls it.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

from tfshards.errors import ConfigError
from tfshards.format import native
from tfshards.format.wire import COMPRESSIONS, CRC, FOOTER_BYTES, HEADER_BYTES, LENGTH, MASK_DELTA

if TYPE_CHECKING:
    import numpy as np

_U32 = 0xFFFFFFFF

_WBITS = {"gzip": 31, "zlib": 15}  # what TF's ZlibInputStream expects for each


def mask(crc: int) -> int:
    """TFRecord's CRC mask: rotate right by 15 bits and add a constant."""
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & _U32


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC-32C of ``data``, continuing from ``value`` (the package, imported on first use)."""
    import crc32c as package

    return int(package.crc32c(data, value))


def masked_crc(data: bytes | bytearray | memoryview) -> int:
    return mask(crc32c(data))


def header(length: int) -> bytes:
    """The 12 bytes that precede a record of ``length`` bytes."""
    raw = LENGTH.pack(length)
    return raw + CRC.pack(masked_crc(raw))


def frame(pieces: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    """Frame one record given as pieces, without joining (copying) them.

    Returns the chunks to write: header, the pieces themselves, footer.
    """
    if len(pieces) == 1:  # small records: one joined piece, one chunk out
        data = pieces[0]
        return [b"".join((header(len(data)), data, CRC.pack(masked_crc(data))))]
    crc = 0
    length = 0
    for piece in pieces:
        crc = crc32c(piece, crc)
        length += len(piece)
    return [header(length), *pieces, CRC.pack(mask(crc))]


class Compressor:
    """Compress a TFRecord stream the way ``TFRecordWriter(options=GZIP|ZLIB)`` does.

    The gzip header zlib writes has no timestamp, so output is byte-deterministic.
    """

    def __init__(self, compression: str) -> None:
        if compression not in COMPRESSIONS:
            raise ConfigError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
        self.compression = compression
        self._z = (
            None
            if compression == "none"
            else zlib.compressobj(6, zlib.DEFLATED, _WBITS[compression])
        )

    def feed(self, chunks: Iterable[bytes | memoryview]) -> list[bytes | memoryview]:
        if self._z is None:
            return list(chunks)
        out = [self._z.compress(c) for c in chunks]
        return [c for c in out if c]

    def finish(self) -> list[bytes]:
        return [] if self._z is None else [self._z.flush()]


def decompress(data: bytes, compression: str) -> bytes:
    """Undo :class:`Compressor` (gzip or zlib); ``"none"`` returns ``data``."""
    if compression == "none":
        return data
    return b"".join(inflate(data, compression))


INFLATE_CHUNK = 1 << 20  # decompressed bytes handed out at a time: memory stays flat


def inflate(data: bytes | memoryview | Iterable[bytes], compression: str) -> Iterator[bytes]:
    """Decompress a gzip or zlib stream piece by piece, at most ``INFLATE_CHUNK`` bytes each.

    ``data`` is the whole compressed stream, or its pieces in order. Finds
    what :func:`zlib.decompress` finds (the same :class:`zlib.error` for a
    damaged or truncated stream; bytes after the stream's end ignored), but a
    caller that stops early, or drops each piece, never holds the whole
    output: a small file can inflate to many GB.
    """
    if compression not in _WBITS:
        raise ConfigError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    inflater = zlib.decompressobj(_WBITS[compression])
    pieces = [data] if isinstance(data, (bytes, memoryview)) else data
    for piece in pieces:
        tail: bytes | memoryview = piece
        while not inflater.eof:
            out = inflater.decompress(tail, INFLATE_CHUNK)
            tail = inflater.unconsumed_tail
            if out:
                yield out
            if not tail and len(out) < INFLATE_CHUNK:  # this piece is used up
                break
        if inflater.eof:
            return
    raise zlib.error("Error -5 while decompressing data: incomplete or truncated stream")


class FrameCounter:
    """Walk the framing of a TFRecord stream fed in pieces, holding at most one header.

    Checks each length's CRC and that each record fits in the stream; data
    CRCs are left to the reader. ``problem`` (with ``offset`` and ``records``,
    the records before it) is None while the framing holds.

    With ``chunk_bytes``, ``cuts`` collects ``(offset, records)`` at the end of
    the first record that ends at least ``chunk_bytes`` past the previous cut:
    record-aligned pieces of about that size to read the stream back in.
    """

    def __init__(self, chunk_bytes: int = 0) -> None:
        self.records = self.offset = 0
        self.problem: str | None = None
        self.cuts: list[tuple[int, int]] = []
        self._chunk_bytes = chunk_bytes
        self._cut = 0  # where the last cut is
        self._head = bytearray()  # the part of the current header seen so far
        self._skip = 0  # data and footer bytes of the current record still to come
        self._length = 0  # the current record's length field

    def feed(self, piece: bytes | memoryview) -> None:
        view = memoryview(piece)
        pos, size = 0, len(view)
        while pos < size and self.problem is None:
            if self._skip:
                step = min(self._skip, size - pos)
                self._skip -= step
                pos += step
                if not self._skip:
                    self.records += 1
                    self.offset += len(self._head) + self._length + FOOTER_BYTES
                    self._head.clear()
                    if self._chunk_bytes and self.offset - self._cut >= self._chunk_bytes:
                        self.cuts.append((self.offset, self.records))
                        self._cut = self.offset
                continue
            take = min(HEADER_BYTES - len(self._head), size - pos)
            self._head += view[pos : pos + take]
            pos += take
            if len(self._head) == HEADER_BYTES:
                self._length, self.problem = read_header(self._head)
                self._skip = self._length + FOOTER_BYTES

    def finish(self) -> None:
        """The stream has ended: a record cut short is a problem."""
        if self.problem is not None or not (self._head or self._skip):
            return
        if len(self._head) < HEADER_BYTES:
            self.problem = truncated_header(len(self._head))
        else:
            self.problem = truncated_record(self._length, self._length + FOOTER_BYTES - self._skip)


def read_header(head: bytes | bytearray | memoryview) -> tuple[int, str | None]:
    """A record's length from its 12-byte header, and the problem if its CRC does not match."""
    (length,) = LENGTH.unpack_from(head)
    (stored,) = CRC.unpack_from(head, LENGTH.size)
    computed = masked_crc(head[: LENGTH.size])
    if stored == computed:
        return length, None
    return length, f"length CRC mismatch (stored {stored:#010x}, computed {computed:#010x})"


def truncated_header(left: int) -> str:
    """How a stream that ends ``left`` bytes into a record header is reported."""
    return f"truncated header: {left} of {HEADER_BYTES} bytes"


def truncated_record(length: int, left: int) -> str:
    """How a record whose ``length`` plus footer runs past the ``left`` bytes there is reported."""
    return (
        f"truncated record: length field says {length} bytes + {FOOTER_BYTES} CRC bytes, "
        f"file has {left} left"
    )


def record_starts(buf: bytes | bytearray | memoryview) -> tuple[np.ndarray, int]:
    """Where each whole record of ``buf`` starts (int64), walking the length fields only.

    No CRC is checked: for bytes just framed, or to cut a stream at record
    boundaries before the records are checked. Also returns where the last
    whole record ends. The C loop (``frame_offsets``) walks where built.
    """
    import numpy as np  # here, not at the top: `tfshards --help` never needs it

    c = native.NATIVE
    if c is not None:
        offsets, end = c.frame_offsets(buf)
        return np.frombuffer(offsets, dtype=np.int64), int(end)
    starts: list[int] = []
    size, end = len(buf), 0
    while size - end >= HEADER_BYTES + FOOTER_BYTES:
        step = HEADER_BYTES + LENGTH.unpack_from(buf, end)[0] + FOOTER_BYTES
        if step > size - end:
            break
        starts.append(end)
        end += step
    return np.array(starts, dtype=np.int64), end


def data_crc_problem(stored: int, computed: int) -> str:
    """How a record whose data CRC does not match is reported."""
    return f"data CRC mismatch (stored {stored:#010x}, computed {computed:#010x})"


class Scanned(NamedTuple):
    """One step of :func:`scan`: a record, or a problem found at ``offset``.

    ``problem`` is None for a good record. A data-CRC problem still carries the
    data (the length was trustworthy); a framing problem ends the scan.
    """

    index: int  # type: ignore[assignment]  # shadows tuple.index on purpose: record number
    offset: int
    data: memoryview | None
    problem: str | None


def scan(buf: bytes | memoryview) -> Iterator[Scanned]:
    """Walk the records of an uncompressed TFRecord buffer, checking both CRCs.

    Unlike TensorFlow's reader, a file cut inside a record header is reported,
    not read as a shorter valid file.
    """
    view = memoryview(buf)
    size = len(view)
    offset = index = 0
    while offset < size:
        if size - offset < HEADER_BYTES:
            yield Scanned(index, offset, None, truncated_header(size - offset))
            return
        length, problem = read_header(view[offset : offset + HEADER_BYTES])
        if problem is not None:
            yield Scanned(index, offset, None, problem)
            return
        start = offset + HEADER_BYTES
        end = start + length
        if end + FOOTER_BYTES > size:
            yield Scanned(index, offset, None, truncated_record(length, max(size - start, 0)))
            return
        data = view[start:end]
        (stored,) = CRC.unpack_from(view, end)
        computed = masked_crc(data)
        problem = None if stored == computed else data_crc_problem(stored, computed)
        yield Scanned(index, offset, data, problem)
        offset = end + FOOTER_BYTES
        index += 1
