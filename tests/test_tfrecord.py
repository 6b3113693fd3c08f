"""TFRecord framing written by tfshards reads back in TensorFlow, and scan finds damage."""

from __future__ import annotations

import gzip
import os

import pytest

from tfshards import tfrecord
from tfshards.errors import ConfigError


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
