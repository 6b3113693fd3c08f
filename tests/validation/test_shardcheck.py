"""One shard's check: read in windows of whole records, it reports what a whole read reports."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from tfshards.format import tfrecord
from tfshards.format.example import encode_bytes
from tfshards.format.exampleparser import decode
from tfshards.format.tfrecord import Compressor
from tfshards.listing.listing import list_files
from tfshards.project.sample import write_synthetic
from tfshards.shardset.manifest import Manifest
from tfshards.validation import shardcheck
from tfshards.validation.shardcheck import ShardCheck, ShardReport, validate_shard
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

RECORDS = 30


@pytest.fixture(scope="module")
def one_shard(tmp_path_factory: pytest.TempPathFactory) -> tuple[Manifest, bytes]:
    """30 records of 16 px JPEGs (~700 bytes each) in one shard, and its bytes."""
    tmp = tmp_path_factory.mktemp("one")
    write_synthetic(str(tmp / "raw"), RECORDS, 16, classes=3, workers=1)
    config = WriteConfig(out=str(tmp / "shards"), num_shards=1, workers=1, executor="serial")
    manifest = write(config, list_files(str(tmp / "raw")), progress=False).manifest
    return manifest, Path(manifest.shard_url(manifest.shards[0])).read_bytes()


def _offsets(data: bytes) -> list[int]:
    return [r.offset for r in tfrecord.scan(data)]


def _flip(at: Callable[[bytes], int]) -> Callable[[bytes], bytes]:
    def damage(data: bytes) -> bytes:
        out = bytearray(data)
        out[at(data)] ^= 0x01
        return bytes(out)

    return damage


def _every_payload(data: bytes) -> bytes:
    out = bytearray(data)
    for offset in _offsets(data):
        out[offset + 60] ^= 0x01  # inside the record: its data CRC fails
    return bytes(out)


def _huge_length(data: bytes) -> bytes:
    at = _offsets(data)[5]
    return data[:at] + tfrecord.header(1 << 20) + data[at + 12 :]  # a CRC that holds


def _label_out_of_range(data: bytes) -> bytes:
    """Record 7 encoded anew with label 9 (of 3 labels)."""
    record = list(tfrecord.scan(data))[7]
    assert record.data is not None
    features = {name: (kind, list(values)) for name, (kind, values) in decode(record.data).items()}
    features["label"] = ("int64", [9])
    end = record.offset + 16 + len(record.data)
    return data[: record.offset] + b"".join(tfrecord.frame([encode_bytes(features)])) + data[end:]


DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "clean": lambda data: data,
    "payload byte": _flip(lambda data: _offsets(data)[4] + 100),
    "length byte": _flip(lambda data: _offsets(data)[9]),
    "length CRC byte": _flip(lambda data: _offsets(data)[9] + 9),
    "every record's data": _every_payload,
    "length past the end": _huge_length,
    "cut in a record": lambda data: data[: _offsets(data)[12] + 40],
    "cut in a header": lambda data: data[: _offsets(data)[12] + 5],
    "appended garbage": lambda data: data + bytes(range(40)),
    "label out of range": _label_out_of_range,
}


def _report(task: ShardCheck, window: int, monkeypatch: pytest.MonkeyPatch) -> ShardReport:
    monkeypatch.setattr(shardcheck, "WINDOW_BYTES", window)
    return validate_shard(task)


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("max_problems", [2, 50])
def test_windows_of_any_size_report_what_one_whole_read_reports(
    one_shard: tuple[Manifest, bytes],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    damage: str,
    max_problems: int,
) -> None:
    manifest, data = one_shard
    damaged = DAMAGE[damage](data)
    (tmp_path / manifest.shards[0].name).write_bytes(damaged)
    task = ShardCheck.of(
        manifest,
        manifest.shards[0],
        path=str(tmp_path / manifest.shards[0].name),
        max_problems=max_problems,
    )
    whole = _report(task, 1 << 30, monkeypatch)
    assert whole.bytes == len(damaged)
    if damage != "clean":
        assert whole.problem_count > 0
    assert sum(whole.label_counts) <= whole.records <= RECORDS + 1
    for window in (64, 1000, 3000):  # smaller than a record, one record, a few records
        assert _report(task, window, monkeypatch) == whole, window


def test_a_record_longer_than_the_window_is_read_whole(
    one_shard: tuple[Manifest, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest, data = one_shard
    (tmp_path / "copy.tfrecord").write_bytes(data)
    task = ShardCheck.of(manifest, manifest.shards[0], path=str(tmp_path / "copy.tfrecord"))
    found = _report(task, 16, monkeypatch)
    assert (found.records, found.problem_count, found.bytes) == (RECORDS, 0, len(data))
    assert len(found.digests) == 32 * RECORDS
    assert bytes(32) not in {found.digests[32 * i : 32 * i + 32] for i in range(RECORDS)}


def _vouched(task: ShardCheck, folder: Path, data: bytes, compression: str) -> ShardCheck:
    """``task`` for ``data`` written in ``folder``, the manifest entry matching its bytes."""
    folder.mkdir()
    (folder / task.name).write_bytes(data)
    sha256 = hashlib.sha256(data).hexdigest()
    return dataclasses.replace(
        task, root=str(folder), bytes=len(data), sha256=sha256, compression=compression
    )


def _packed(data: bytes, compression: str) -> bytes:
    packer = Compressor(compression)
    return b"".join([*packer.feed([data]), *packer.finish()])


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
@pytest.mark.parametrize("damage", DAMAGE)
def test_compressed_shard_checked_as_it_inflates_reports_what_the_uncompressed_one_does(
    one_shard: tuple[Manifest, bytes],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    loop: str,
    damage: str,
    compression: str,
) -> None:
    manifest, data = one_shard
    damaged = DAMAGE[damage](data)
    task = ShardCheck.of(manifest, manifest.shards[0], path="x/" + manifest.shards[0].name)
    task = dataclasses.replace(task, max_problems=5)
    plain = _report(_vouched(task, tmp_path / "plain", damaged, "none"), 1 << 30, monkeypatch)
    packed = _packed(damaged, compression)
    vouched = _vouched(task, tmp_path / "packed", packed, compression)
    for window in (64, 1000, 3000, 1 << 30):  # smaller than a record, one record, a few, all
        found = _report(vouched, window, monkeypatch)
        assert found.bytes == len(packed)
        assert dataclasses.replace(found, bytes=len(damaged)) == plain, window


def test_a_stream_that_stops_inflating_is_reported_before_its_records(
    one_shard: tuple[Manifest, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest, data = one_shard
    damaged = _label_out_of_range(data)  # record 7's problem comes before the stream breaks
    task = ShardCheck.of(manifest, manifest.shards[0], path="x/cut")
    cut = _vouched(task, tmp_path / "cut", _packed(damaged, "gzip")[:-9], "gzip")
    found = _report(cut, 1000, monkeypatch)
    assert [str(p) for p in found.problems] == [
        "cut: cannot decompress (gzip): Error -5 while decompressing data: "
        "incomplete or truncated stream",
        f"cut: record 7 at byte {_offsets(damaged)[7]}: label out of range: "
        "expected 0..2 (3 labels), found 9",
    ]
    assert found.records == 0  # unknown: no count mismatch is reported
