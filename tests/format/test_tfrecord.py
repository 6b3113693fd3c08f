"""TFRecord framing written by tfshards reads back in TensorFlow, and scan finds damage."""

from __future__ import annotations

import gzip
import os
import random
import zlib

import pytest

from tfshards.errors import ConfigError
from tfshards.format import tfrecord


def _stream(records: list[bytes], compression: str = "none") -> bytes:
    comp = tfrecord.Compressor(compression)
    chunks = []
    for r in records:
        chunks += comp.feed(tfrecord.frame([r]))
    chunks += comp.finish()
    return b"".join(chunks)


RECORDS = [b"", b"a", os.urandom(5000), b"hello" * 100]


@pytest.mark.parametrize("compression", ["none", "gzip", "zlib"])
def test_frames_read_back_by_tensorflow(tmp_path, compression):
    import tensorflow as tf

    path = tmp_path / "x.tfrecord"
    path.write_bytes(_stream(RECORDS, compression))
    tf_name = {"none": "", "gzip": "GZIP", "zlib": "ZLIB"}[compression]
    got = [r.numpy() for r in tf.data.TFRecordDataset(str(path), compression_type=tf_name)]
    assert got == RECORDS


def test_tensorflow_writer_bytes_equal_ours(tmp_path):
    import tensorflow as tf

    path = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as w:
        for r in RECORDS:
            w.write(r)
    assert path.read_bytes() == _stream(RECORDS)


def test_gzip_stream_is_deterministic_and_plain_gzip():
    a, b = _stream(RECORDS, "gzip"), _stream(RECORDS, "gzip")
    assert a == b
    assert gzip.decompress(a) == _stream(RECORDS)
    assert tfrecord.decompress(a, "gzip") == _stream(RECORDS)


def test_frame_pieces_equal_frame_of_joined_bytes():
    assert b"".join(tfrecord.frame([b"ab", b"", b"cde"])) == b"".join(tfrecord.frame([b"abcde"]))


def test_scan_clean_stream_yields_offsets():
    buf = _stream(RECORDS)
    scanned = list(tfrecord.scan(buf))
    assert [bytes(s.data or b"") for s in scanned] == RECORDS
    assert [s.problem for s in scanned] == [None] * 4
    assert scanned[1].offset == 16  # 12 header + 0 data + 4 footer
    assert [s.index for s in scanned] == [0, 1, 2, 3]


def test_scan_reports_flipped_payload_byte_and_continues():
    buf = bytearray(_stream(RECORDS))
    third = list(tfrecord.scan(bytes(buf)))[2].offset
    buf[third + 12 + 100] ^= 0x01
    scanned = list(tfrecord.scan(bytes(buf)))
    assert len(scanned) == 4
    assert scanned[2].problem is not None and "data CRC mismatch" in scanned[2].problem
    assert scanned[3].problem is None


def test_scan_reports_corrupt_length_and_stops():
    buf = bytearray(_stream(RECORDS))
    buf[16] ^= 0xFF  # length field of record 1
    scanned = list(tfrecord.scan(bytes(buf)))
    assert len(scanned) == 2
    assert scanned[1].offset == 16
    assert scanned[1].problem is not None and "length CRC mismatch" in scanned[1].problem


@pytest.mark.parametrize("cut", [3, 14, 40])
def test_scan_reports_truncation_that_tensorflow_would_accept(cut):
    buf = _stream(RECORDS)
    last = list(tfrecord.scan(buf))[3].offset
    scanned = list(tfrecord.scan(buf[: last + cut]))
    assert scanned[-1].index == 3
    assert scanned[-1].problem is not None and "truncated" in scanned[-1].problem


def test_unknown_compression_is_a_config_error():
    with pytest.raises(ConfigError, match="compression must be one of"):
        tfrecord.Compressor("lz4")


def _pieces(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out, pos = [], 0
    while pos < len(data):
        step = rng.choice([1, 3, 12, 16, 700, 5000])
        out.append(data[pos : pos + step])
        pos += step
    return out


@pytest.mark.parametrize("seed", range(8))
def test_frame_counter_fed_in_pieces_finds_what_scan_finds(seed):
    rng = random.Random(seed)
    clean = _stream(RECORDS * 3)
    for _ in range(30):
        damaged = bytearray(clean[: rng.randrange(len(clean) + 1)])
        if damaged and rng.random() < 0.5:
            damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        scanned = list(tfrecord.scan(bytes(damaged)))
        framing = [s for s in scanned if s.data is None]  # data CRCs are not its business
        counter = tfrecord.FrameCounter()
        for piece in _pieces(bytes(damaged), seed):
            counter.feed(piece)
        counter.finish()
        if framing:
            assert (counter.problem, counter.records, counter.offset) == (
                framing[0].problem,
                framing[0].index,
                framing[0].offset,
            )
        else:
            assert (counter.problem, counter.records) == (None, len(scanned))


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
def test_inflate_in_pieces_finds_what_zlib_decompress_finds(compression):
    stream = _stream(RECORDS * 50, compression)
    rng = random.Random(1)
    for cut in [len(stream), len(stream) - 1, len(stream) - 9, 5, 0, *rng.sample(range(9), 3)]:
        for damaged in (stream[:cut], stream[:cut] + b"trailing bytes"):
            try:
                expected: bytes | str = zlib.decompress(
                    damaged, {"gzip": 31, "zlib": 15}[compression]
                )
            except zlib.error as exc:
                expected = str(exc)
            for pieces in (damaged, _pieces(damaged, cut)):
                try:
                    out = list(tfrecord.inflate(pieces, compression))
                except zlib.error as exc:
                    assert str(exc) == expected
                else:
                    assert b"".join(out) == expected
                    assert all(len(o) <= tfrecord.INFLATE_CHUNK for o in out)


def test_inflate_hands_out_a_bomb_a_piece_at_a_time():
    bomb = zlib.compress(bytes(64 << 20), 9)  # 64 MiB of zeros in ~64 KB
    pieces = tfrecord.inflate(bomb, "zlib")
    assert next(pieces) == bytes(tfrecord.INFLATE_CHUNK)
    assert sum(len(p) for p in pieces) == (64 << 20) - tfrecord.INFLATE_CHUNK
