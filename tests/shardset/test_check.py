"""One check of a file against its manifest entry: size, sha256, framing, record count."""

from __future__ import annotations

import hashlib

import pytest

from tfshards.format import tfrecord
from tfshards.shardset import check
from tfshards.shardset.manifest import ShardInfo


def _shard(records: list[bytes], compression: str = "none") -> tuple[bytes, ShardInfo]:
    comp = tfrecord.Compressor(compression)
    pieces = [p for r in records for p in comp.feed(tfrecord.frame([r]))] + comp.finish()
    data = b"".join(bytes(p) for p in pieces)
    return data, ShardInfo("s.tfrecord", len(records), len(data), hashlib.sha256(data).hexdigest())


@pytest.mark.parametrize("compression", ["none", "gzip", "zlib"])
def test_the_file_its_entry_describes_has_no_mismatch(compression):
    data, shard = _shard([b"a" * 10, b"", b"b" * 3000], compression)
    found = check.read([data[:7], data[7:]], compression)
    assert (found.size, found.sha256, found.records) == (len(data), shard.sha256, 3)
    assert check.mismatches(shard, found) == []


def test_mismatches_come_in_one_order_with_one_wording():
    data, shard = _shard([b"x" * 100] * 4)
    cut = data[: len(data) - 116]  # the last record gone: framing intact, one record short
    found = check.read([cut], "none")
    assert [m.what for m in check.mismatches(shard, found)] == [
        f"size mismatch: expected {shard.bytes} bytes, found {len(cut)}",
        f"sha256 mismatch: expected {shard.sha256}, found {hashlib.sha256(cut).hexdigest()}",
        "record count mismatch: expected 4, found 3",
    ]


def test_broken_framing_names_the_record_and_unhashed_bytes_are_not_compared():
    data, shard = _shard([b"x" * 100] * 4)
    damaged = data[:116] + bytes([data[116] ^ 1]) + data[117:]  # record 1's length byte
    found = check.read([damaged], "none", hashed=False)
    assert found.sha256 is None
    (broken, count) = check.mismatches(shard, found)
    assert (broken.index, broken.offset) == (1, 116) and "length CRC mismatch" in broken.what
    assert count.what == "record count mismatch: expected 4, found 1"


def test_a_stream_that_does_not_inflate_has_no_count():
    data, shard = _shard([b"x" * 100] * 4, "gzip")
    found = check.read([data[: len(data) // 2]], "gzip")
    assert found.records is None
    whats = [m.what for m in check.mismatches(shard, found)]
    assert whats[0].startswith("size mismatch") and whats[1].startswith("sha256 mismatch")
    assert whats[2].startswith("cannot decompress (gzip): ") and len(whats) == 3
