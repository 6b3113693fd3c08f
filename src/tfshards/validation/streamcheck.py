"""Check a TFRecord stream as it inflates, in windows of whole records, or walk its framing.

A gzip/zlib shard inflates up to ~1,000-fold (a 1 MB gzip member holds 1 GiB
of zeros), so even a shard whose bytes the manifest vouches for is checked
while :func:`tfshards.format.tfrecord.inflate` hands out its stream: memory
holds one window and the piece inflated after it, or the one record longer
than the window.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from tfshards.format.tfrecord import FrameCounter, read_header, record_starts, truncated_record
from tfshards.format.wire import FOOTER_BYTES, HEADER_BYTES

# (whole records, the first one's index, its byte offset in the stream) -> how many it holds
WindowCheck = Callable[[memoryview, int, int], int]
Report = Callable[[str, int, int], None]  # (what, record index, byte offset)

# TensorFlow cannot parse an Example of 2 GiB or more (protobuf's message limit), so a
# longer record is never held to be checked: it is inflated past and reported.
MAX_RECORD_BYTES = (1 << 31) - 1


def whole_records(window: bytes | bytearray | memoryview) -> tuple[int, int]:
    """Bytes of the whole records that start ``window`` (walking lengths only), and their count."""
    starts, end = record_starts(window)
    return end, len(starts)


def frame_size(window: bytes | bytearray | memoryview) -> int | None:
    """Bytes of the record starting ``window`` (None: its length CRC does not hold)."""
    length, problem = read_header(window[:HEADER_BYTES])
    return None if problem is not None else HEADER_BYTES + length + FOOTER_BYTES


class _Stream:
    """The part of an inflating stream read but not yet checked."""

    def __init__(self, pieces: Iterator[bytes]) -> None:
        self.pieces = pieces
        self.buf = bytearray()
        self.ended = False

    def fill(self, size: int) -> None:
        """Hold at least ``size`` bytes, or all that is left (``ended``)."""
        while len(self.buf) < size:
            piece = next(self.pieces, None)
            if piece is None:
                self.ended = True
                return
            self.buf += piece  # grows in place (a large record is not copied as it grows)

    def skip(self, size: int) -> int:
        """Read past the next ``size`` bytes, dropping them; how many there were (fewer: ended)."""
        seen, self.buf = len(self.buf), bytearray()
        while seen < size:
            piece = next(self.pieces, None)
            if piece is None:
                self.ended = True
                break
            seen += len(piece)
        return min(seen, size)


def check_stream(
    pieces: Iterable[bytes],
    check: WindowCheck,
    report: Report,
    window: int,
) -> int:
    """Check the TFRecord stream given in ``pieces``, ``window`` bytes of whole records at a time.

    ``check(records, first, offset)`` checks whole records (record ``first``
    at byte ``offset`` of the stream) and returns how many it found: fewer
    than the window holds means the framing broke there, and the walk ends,
    as it ends after the last window (whatever the stream ends with: a record
    cut short is ``check``'s to report). A record longer than the window is
    gathered whole; one whose length field says more than
    ``MAX_RECORD_BYTES`` is read past, never held, and reported through
    ``report`` (one cut short, in the words ``check`` would use). So ``check``
    sees what one whole buffer would show it, in the same order.

    Returns the records found. Raises what ``pieces`` raises (``zlib.error``).
    """
    stream = _Stream(iter(pieces))
    pos = records = 0
    window = max(window, HEADER_BYTES)
    while True:
        stream.fill(window)
        buf = stream.buf
        if not buf:
            return records
        end, walked = (len(buf), -1) if stream.ended else whole_records(buf)
        if end == 0:  # its first record is longer than what is held
            need = frame_size(buf)
            if need is not None:
                if _gather(stream, need, report, records, pos):
                    continue
                return records
            end, walked = len(buf), -1  # its length CRC fails: checked (and reported), last
        found = check(memoryview(buf)[:end], records, pos)
        records += found
        if found != walked:
            return records
        stream.buf = buf[end:]  # a copy: ``check`` may still hold views of ``buf``
        pos += end


def _gather(stream: _Stream, need: int, report: Report, index: int, offset: int) -> bool:
    """Hold the record of ``need`` bytes (framed) that starts ``stream``, or all the stream has.

    False: it is not held but reported, as longer than an Example can be, or
    than this process can hold (under an address-space limit, say).
    """
    length = need - HEADER_BYTES - FOOTER_BYTES
    says = f"length field says {length} bytes"
    if length > MAX_RECORD_BYTES:
        seen = stream.skip(need)
        what = f"record too large: {says}, an Example holds at most {MAX_RECORD_BYTES}"
        if seen < need:  # cut short: what a check of the whole stream would say
            what = truncated_record(length, seen - HEADER_BYTES)
        report(what, index, offset)
        return False
    try:
        stream.fill(need)
    except MemoryError:  # the one allocation that grows with what the stream says
        stream.buf = bytearray()
        report(f"cannot hold the record to check it: {says}", index, offset)
        return False
    return True


def walk_framing(pieces: Iterable[bytes]) -> FrameCounter:
    """Walk the framing of a stream given in pieces, stopping at its first problem."""
    walk = FrameCounter()
    for piece in pieces:
        walk.feed(piece)
        if walk.problem is not None:
            return walk
    walk.finish()
    return walk
