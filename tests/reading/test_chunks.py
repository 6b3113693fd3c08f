"""Records are read back in chunks checked as they are read: a shard changed after it was
verified is refused with an error naming it, never handed on (and no forged length is trusted)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tfshards.errors import RecordError, ShardError
from tfshards.format import native, tfrecord
from tfshards.listing.listing import list_files
from tfshards.project.sample import write_synthetic
from tfshards.reading import chunks, gate, loader
from tfshards.shardset.manifest import Manifest, ShardInfo
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

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
    with pytest.raises(
        ShardError, match=rf"{path}: size mismatch: expected {size} bytes, found {size - 100}$"
    ):
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


# ----------------------------------------------------------------------------- through the loader


@pytest.fixture(scope="module")
def large_shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Manifest]:
    """240 synthetic 256 px JPEGs (~10 KB each) in 2 shards of ~2.4 MB: 3 chunks each."""
    base = tmp_path_factory.mktemp("large")
    write_synthetic(str(base / "img"), 240, 256, workers=1)
    listing = list_files(str(base / "img"))
    out = {}
    for compression in ("none", "gzip"):
        config = WriteConfig(
            out=str(base / compression),
            num_shards=2,
            workers=1,
            executor="serial",
            compression=compression,
        )
        out[compression] = write(config, listing, progress=False).manifest
    return out


def _copy(manifest: Manifest, dest: Path) -> Manifest:
    dest.mkdir()
    for shard in manifest.shards:
        (dest / shard.name).write_bytes(Path(manifest.shard_url(shard)).read_bytes())
    return dataclasses.replace(manifest, root=str(dest))


# The CLI's way: one line on stderr and exit 1 for a TfshardsError (TF_CPP_MIN_LOG_LEVEL=2).
_TAMPERED_MID_EPOCH = """
import os, sys
from tfshards.errors import TfshardsError
from tfshards.reading import corruption, loader
from tfshards.shardset.manifest import load

manifest = load(sys.argv[1])
path, offset, data = sys.argv[2], int(sys.argv[3]), bytes.fromhex(sys.argv[4])
try:
    with corruption.shard_errors(manifest):
        batches = iter(loader.make_dataset(manifest.shards, manifest, batch_size=4, training=False))
        next(batches)
        st = os.stat(path)
        with open(path, "r+b") as f:  # in place: the size stays
            f.seek(offset)
            f.write(data)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # what a 1 s timestamp would show
        for _ in batches:
            pass
except TfshardsError as exc:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(1)
print("read to the end")
"""


def _run_child(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )


def _run_tampered(
    manifest: Manifest, tmp_path: Path, path: str, offset: int, data: bytes
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "manifest.json").write_bytes(manifest.to_json())
    return _run_child(
        _TAMPERED_MID_EPOCH, str(tmp_path / "manifest.json"), path, str(offset), data.hex()
    )


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The child's one error line, once it is sure it exited 1 (SIGSEGV is -11) with no traceback.

    TensorFlow's own start-up lines (oneDNN, absl) come before it whatever the log level.
    """
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stderr.splitlines()
    assert [line for line in lines if line.startswith("error:")] == lines[-1:], result.stderr
    return lines[-1]


@pytest.mark.slow
@pytest.mark.parametrize("forged", ["length-2**36", "data-byte"])
def test_record_overwritten_in_place_mid_epoch_stops_the_process_with_one_line_naming_it(
    large_shards, tmp_path, forged
):
    manifest = _copy(large_shards["none"], tmp_path / "copy")
    shard = manifest.shards[-1]
    path = manifest.shard_url(shard)
    clean = Path(path).read_bytes()
    index = shard.records - 2  # in the last chunk: not read when the first batch is out
    at = list(tfrecord.scan(clean))[index].offset
    if forged == "length-2**36":  # what crashed TFRecordDataset with SIGSEGV
        offset, data = at, tfrecord.header(1 << 36)
        problem = rf"length field says {1 << 36} bytes \+ 4 CRC bytes, past byte {len(clean)}, "
    else:
        offset, data = at + 20, bytes([clean[at + 20] ^ 0xFF])
        problem = "data CRC mismatch"
    result = _run_tampered(manifest, tmp_path, path, offset, data)
    assert re.fullmatch(
        rf"error: {re.escape(path)}: record {index} at byte {at}: {problem}.*",
        _one_error_line(result),
    )


@pytest.mark.slow
def test_gzip_shard_damaged_in_place_mid_epoch_stops_the_process_with_one_line_naming_it(
    large_shards, tmp_path
):
    manifest = _copy(large_shards["gzip"], tmp_path / "copy")
    path = manifest.shard_url(manifest.shards[-1])
    size = os.path.getsize(path)
    result = _run_tampered(manifest, tmp_path, path, size - size // 8, bytes(64))
    assert _one_error_line(result).startswith(f"error: {path}: ")


# The same through the cache: the remote is memory:// of the child itself.
_CACHED_COPY_TAMPERED_MID_EPOCH = """
import dataclasses, os, sys
from fsspec.implementations.memory import MemoryFileSystem
from tfshards.errors import TfshardsError
from tfshards.format import tfrecord
from tfshards.reading import corruption, loader
from tfshards.reading.cache import ShardCache
from tfshards.shardset.manifest import load

local = load(sys.argv[1])
cache_dir, offset = sys.argv[2], int(sys.argv[3])
manifest = dataclasses.replace(local, root="memory://bucket/shards")
for shard in local.shards:
    with open(local.shard_url(shard), "rb") as f:
        MemoryFileSystem().pipe_file(manifest.shard_url(shard).removeprefix("memory://"), f.read())
copy = ShardCache(cache_dir).path(manifest.shards[-1])
try:
    with corruption.shard_errors(manifest, cache_dir=cache_dir):
        batches = iter(
            loader.make_dataset(
                manifest.shards, manifest, batch_size=4, training=False, cache_dir=cache_dir
            )
        )
        next(batches)
        st = os.stat(copy)
        with open(copy, "r+b") as f:
            f.seek(offset)
            f.write(tfrecord.header(1 << 36))
        os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
        for _ in batches:
            pass
except TfshardsError as exc:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(1)
print("read to the end")
"""


@pytest.mark.slow
def test_cached_copy_overwritten_in_place_mid_epoch_stops_the_process_naming_the_remote_shard(
    large_shards, tmp_path
):
    manifest = large_shards["none"]
    shard = manifest.shards[-1]
    clean = Path(manifest.shard_url(shard)).read_bytes()
    index = shard.records - 2
    at = list(tfrecord.scan(clean))[index].offset
    (tmp_path / "manifest.json").write_bytes(manifest.to_json())
    result = _run_child(
        _CACHED_COPY_TAMPERED_MID_EPOCH,
        str(tmp_path / "manifest.json"),
        str(tmp_path / "cache"),
        str(at),
    )
    url = f"memory://bucket/shards/{shard.name}"
    assert _one_error_line(result) == (
        f"error: {url}: record {index} at byte {at}: length field says {1 << 36} bytes + 4 CRC "
        f"bytes, past byte {len(clean)}, where the verified records end "
        "(rewritten since it was verified)"
    )


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_iterator_restored_from_a_checkpoint_mid_shard_reads_on_where_it_stopped(
    large_shards, tmp_path, compression
):
    import tensorflow as tf

    manifest = large_shards[compression]
    options = tf.data.Options()  # what training sets: the py_functions hold no state to save
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    ds = loader.make_dataset(
        manifest.shards, manifest, batch_size=4, training=False, decode=False, features=["path"]
    ).with_options(options)
    running = iter(ds)
    for _ in range(40):  # 160 of 240 records: into the second chunk of each shard
        next(running)
    saved = tf.train.Checkpoint(iterator=running).write(str(tmp_path / "ck"))
    rest = [p for features, _ in running for p in features["path"].numpy().tolist()]
    restored = iter(ds)
    tf.train.Checkpoint(iterator=restored).read(saved).assert_consumed()
    again = [p for features, _ in restored for p in features["path"].numpy().tolist()]
    assert len(rest) == 80 and again == rest
