"""A stream checked a window of whole records at a time sees what a check of it whole sees."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from tfshards.format import tfrecord
from tfshards.validation import streamcheck
from tfshards.validation.streamcheck import check_stream

Seen = tuple[int, int, bytes | None, str | None]  # record index, byte offset, data, problem


def _whole(stream: bytes) -> list[Seen]:
    """What a walk of the whole stream finds, record by record."""
    return [
        (r.index, r.offset, None if r.data is None else bytes(r.data), r.problem)
        for r in tfrecord.scan(stream)
    ]


def _windowed(stream: bytes, piece: int, window: int) -> tuple[int, list[Seen], list[Seen]]:
    """check_stream over ``stream`` in pieces: its count, what windows showed, what it reported."""
    seen: list[Seen] = []
    reported: list[Seen] = []

    def check(records: memoryview, first: int, offset: int) -> int:
        found = _whole(bytes(records))
        seen.extend((first + i, offset + at, data, problem) for i, at, data, problem in found)
        return sum(data is not None for _, _, data, _ in found)

    def pieces() -> Iterator[bytes]:
        for at in range(0, len(stream), piece):
            yield stream[at : at + piece]

    def report(what: str, index: int, offset: int) -> None:
        reported.append((index, offset, None, what))

    return check_stream(pieces(), check, report, window), seen, reported


def _records(rng: random.Random, count: int) -> bytes:
    """``count`` framed records of 0 to 5,000 random bytes."""
    sizes = [rng.choice([0, 1, 100, 999, 5000]) for _ in range(count)]
    return b"".join(b"".join(tfrecord.frame([rng.randbytes(n)])) for n in sizes)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("window", [16, 100, 4096, 1 << 20])
def test_windows_of_any_size_show_every_record_once_where_a_whole_walk_finds_it(
    loop: str, seed: int, window: int
) -> None:
    rng = random.Random(seed)
    stream = _records(rng, 40)
    cut = [stream, stream[: rng.randrange(len(stream))]]  # whole, and cut anywhere
    bad = bytearray(stream)
    bad[rng.randrange(len(bad))] ^= 0x10  # a data or a length CRC fails
    for damaged in [*cut, bytes(bad)]:
        count, seen, reported = _windowed(damaged, rng.choice([1, 7, 1000, 1 << 20]), window)
        whole = _whole(damaged)
        assert (seen, reported) == (whole, [])
        assert count == sum(data is not None for _, _, data, _ in whole)


def test_a_record_longer_than_an_example_can_be_is_read_past_not_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(streamcheck, "MAX_RECORD_BYTES", 1000)
    stream = _records(random.Random(0), 3) + b"".join(tfrecord.frame([bytes(1001)]))
    stream += _records(random.Random(1), 2)
    first = _whole(stream)[:3]
    at = first[-1][1] + 16 + len(first[-1][2] or b"")
    count, seen, reported = _windowed(stream, 64, 128)
    assert (count, seen) == (3, first)
    assert reported == [
        (
            3,
            at,
            None,
            "record too large: length field says 1001 bytes, an Example holds at most 1000",
        )
    ]


def test_a_huge_length_in_a_stream_cut_short_is_worded_as_a_whole_walk_words_it() -> None:
    stream = tfrecord.header(1 << 40) + bytes(300)  # its CRC holds: 1 TiB said, 300 bytes there
    count, seen, reported = _windowed(stream, 64, 128)
    assert (count, seen) == (0, [])
    assert reported == _whole(stream)
    assert reported[0][3] == (
        "truncated record: length field says 1099511627776 bytes + 4 CRC bytes, file has 300 left"
    )
