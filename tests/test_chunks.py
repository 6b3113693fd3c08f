"""Records are read back in chunks checked as they are read: a shard changed after it was
verified is refused with an error naming it, never handed on (and no forged length is trusted)."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import pytest

from tfshards.errors import RecordError, ShardError
from tfshards.format import native, tfrecord
from tfshards.reading import chunks, gate
from tfshards.writing.manifest import ShardInfo

CHUNK = 4096  # small chunks, so that a few dozen records make several


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gate, "CHUNK_BYTES", CHUNK)
    gate.forget()


@pytest.fixture(params=["c", "python"])
def loops(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both framing walks: the C loop where built, and the Python reference."""
    if request.param == "c" and native.NATIVE is None:
        pytest.skip("the C loops are not built")
    if request.param == "python":
        monkeypatch.setattr(native, "NATIVE", None)
    return str(request.param)


def _records(n: int = 60, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    sizes = [0, 1, 3 * CHUNK, *(rng.randrange(50, 900) for _ in range(n - 3))]
    return [rng.randbytes(size) for size in sizes]


def _shard(tmp_path: Path, records: list[bytes], compression: str = "none") -> gate.Gate:
    comp = tfrecord.Compressor(compression)
    pieces = [p for r in records for p in comp.feed(tfrecord.frame([r]))] + comp.finish()
    data = b"".join(bytes(p) for p in pieces)
    path = tmp_path / "data-00000-of-00001.tfrecord"
    path.write_bytes(data)
    info = ShardInfo(path.name, len(records), len(data), hashlib.sha256(data).hexdigest())
    return gate.Gate({str(path): (info, f"file://{path}")}, compression)


def _read_all(shard: gate.Gate) -> list[bytes]:
    (path,) = shard._entries
    out = []
    for row in chunks.layout(shard, path).tolist():
        data, starts, lengths = chunks.read_chunk(shard, path, row)
        out += [data[s : s + n] for s, n in zip(starts.tolist(), lengths.tolist(), strict=True)]
    return out


def _offsets(shard: gate.Gate) -> list[int]:
    (path,) = shard._entries
    return [s.offset for s in tfrecord.scan(Path(path).read_bytes())]


def _overwrite(path: str, offset: int, data: bytes) -> None:
    """Overwrite in place, size and mtime kept (as a coarse-timestamp filesystem would show)."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("compression", ["none", "gzip", "zlib"])
def test_chunks_of_a_verified_shard_give_back_every_record_in_order(tmp_path, loops, compression):
    records = _records()
    shard = _shard(tmp_path, records, compression)
    (path,) = shard._entries
    rows = chunks.layout(shard, path)
    stream = sum(len(r) + 16 for r in records)
    assert len(rows) > 3 and rows[0, 0] == 0 and rows[-1, 1] == stream
    assert (rows[1:, 0] == rows[:-1, 1]).all() and (
        rows[1:, 2] == rows[:-1, 2] + rows[:-1, 3]
    ).all()
    assert rows[:, 3].sum() == len(records)
    assert _read_all(shard) == records


def test_header_forged_after_verification_is_refused_where_the_verified_records_end(
    tmp_path, loops
):
    shard = _shard(tmp_path, _records())
    (path,) = shard._entries
    rows = chunks.layout(shard, path).tolist()
    _, end, first, _ = rows[2]
    at = _offsets(shard)[first + 1]
    _overwrite(path, at, tfrecord.header(1 << 36))  # 64 GiB, with a valid length CRC
    assert chunks.read_chunk(shard, path, rows[1])  # the chunks before it still read
    with pytest.raises(RecordError) as info:
        chunks.read_chunk(shard, path, rows[2])
    assert str(info.value) == (
        f"file://{path}: record {first + 1} at byte {at}: length field says {1 << 36} bytes "
        f"+ 4 CRC bytes, past byte {end}, where the verified records end "
        "(rewritten since it was verified)"
    )
    assert (info.value.shard, info.value.index, info.value.offset) == (
        Path(path).name,
        first + 1,
        at,
    )
    assert (
        chunks.raised_in(f"UnknownError: ... RecordError: {info.value}\n\t[[node]]") is info.value
    )


def test_data_byte_flipped_after_verification_names_the_record(tmp_path, loops):
    shard = _shard(tmp_path, _records())
    (path,) = shard._entries
    rows = chunks.layout(shard, path).tolist()
    first = rows[-1][2]
    at = _offsets(shard)[first]
    byte = Path(path).read_bytes()[at + 12]
    _overwrite(path, at + 12, bytes([byte ^ 0xFF]))
    with pytest.raises(RecordError, match=rf"record {first} at byte {at}: data CRC mismatch"):
        chunks.read_chunk(shard, path, rows[-1])


def test_shard_cut_after_verification_is_refused_with_both_sizes(tmp_path):
    shard = _shard(tmp_path, _records())
    (path,) = shard._entries
    rows = chunks.layout(shard, path).tolist()
    size = os.path.getsize(path)
    os.truncate(path, size - 100)
    with pytest.raises(ShardError, match=rf"expected {size} bytes, found {size - 100} "):
        chunks.read_chunk(shard, path, rows[0])


def test_records_reframed_with_valid_crcs_are_refused_by_their_count(tmp_path, loops):
    records = _records()
    shard = _shard(tmp_path, records)
    (path,) = shard._entries
    rows = chunks.layout(shard, path).tolist()
    start, end, first, count = rows[1]
    # The chunk's bytes as one record (all CRCs valid, same size): framing holds, count does not.
    one = tfrecord.frame([b"x" * (end - start - 16)])[0]
    _overwrite(path, start, bytes(one))
    with pytest.raises(
        ShardError,
        match=rf"bytes {start} to {end}: expected {count} records from record {first}, found 1 ",
    ):
        chunks.read_chunk(shard, path, rows[1])


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
def test_compressed_chunks_read_in_order_inflate_the_shard_once(tmp_path, monkeypatch, compression):
    records = _records()
    shard = _shard(tmp_path, records, compression)
    opened: list[str] = []
    real = chunks._inflate_file

    def counting(path: str, how: str):  # type: ignore[no-untyped-def]
        opened.append(path)
        return real(path, how)

    monkeypatch.setattr(chunks, "_inflate_file", counting)
    assert _read_all(shard) == records
    assert len(opened) == 1


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
def test_compressed_chunk_read_out_of_order_is_the_same_bytes(tmp_path, compression):
    records = _records()
    shard = _shard(tmp_path, records, compression)
    (path,) = shard._entries
    rows = chunks.layout(shard, path).tolist()
    in_order = [chunks.read_chunk(shard, path, row)[0] for row in rows]
    backwards = [chunks.read_chunk(shard, path, row)[0] for row in reversed(rows)]
    assert backwards[::-1] == in_order


def test_compressed_shard_damaged_after_verification_is_refused(tmp_path):
    shard = _shard(tmp_path, _records(), "gzip")
    (path,) = shard._entries
    rows = chunks.layout(shard, path).tolist()
    size = os.path.getsize(path)
    _overwrite(path, size // 2, bytes(64))  # deflate blocks zeroed in the middle
    with pytest.raises((RecordError, ShardError), match=rf"^file://{path}: "):
        for row in rows:
            chunks.read_chunk(shard, path, row)


def test_shard_rewritten_before_it_is_opened_again_is_refused_by_its_sha256(tmp_path):
    shard = _shard(tmp_path, _records())
    (path,) = shard._entries
    chunks.layout(shard, path)
    data = bytearray(Path(path).read_bytes())
    data[-1] ^= 1
    Path(path).write_bytes(bytes(data))  # a new ctime: the stat no longer matches
    with pytest.raises(ShardError, match="sha256 mismatch") as info:
        chunks.layout(shard, path)
    assert chunks.raised_in(str(info.value)) is info.value
