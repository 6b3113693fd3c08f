"""Record index files: tfrecord2idx's format, from the writer, read by the tfrecord package."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tfshards.format.tfrecord import frame
from tfshards.listing.listing import list_files
from tfshards.shardset import layout
from tfshards.shardset.layout import MANIFEST_NAME
from tfshards.shardset.manifest import Manifest
from tfshards.validation.validate import ValidateConfig, validate
from tfshards.writing.config import WriteConfig
from tfshards.writing.recordindex import RecordIndex, index_bytes
from tfshards.writing.writer import write

# The tfrecord package and TensorFlow register the same protos (tensorflow.Example):
# with protobuf's upb backend the second import fails ("duplicate symbol
# 'tensorflow.BytesList'"), whichever comes first. So it runs in a process of its own.
_READ = """
import hashlib, json, sys
from tfrecord.reader import multi_tfrecord_loader, tfrecord_iterator
from tfrecord.tools.tfrecord2idx import create_index

args = json.load(sys.stdin)
root, names, out = args["root"], args["names"], {"sequential": {}, "parts": {}}
sha = lambda b: hashlib.sha256(bytes(b)).hexdigest()
for name in names:
    data, index = f"{root}/{name}.tfrecord", f"{root}/index/{name}.tfrecord.idx"
    create_index(data, f"{args['tmp']}/{name}.idx")
    out["sequential"][name] = [sha(r) for r in tfrecord_iterator(data)]
    # What a DataLoader worker k of 3 reads of the shard: the index cuts the file at records.
    out["parts"][name] = [
        [sha(r) for r in tfrecord_iterator(data, index, (k, 3))] for k in range(3)
    ]
# MultiTFRecordDataset's loader: each shard from a random record on (an offset of its index),
# round once, shards interleaved at random.
loaded = multi_tfrecord_loader(
    f"{root}/{{}}.tfrecord", f"{root}/index/{{}}.tfrecord.idx", dict.fromkeys(names, 1.0),
    description={"image": "byte", "label": "int", "path": "byte"}, infinite=False,
)
out["multi"] = sorted([r["path"].decode(), int(r["label"][0]), sha(r["image"])] for r in loaded)
json.dump(out, sys.stdout)
"""


def _read_with_tfrecord(root: str, names: list[str], tmp: Path) -> dict[str, Any]:
    args = json.dumps({"root": root, "names": names, "tmp": str(tmp)})
    done = subprocess.run(
        [sys.executable, "-c", _READ], input=args, capture_output=True, text=True, check=True
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.fixture
def raw(shared_raw: Callable[..., Path]) -> Path:
    return shared_raw(40, 16, fmt="jpeg", classes=3, seed=5)


@pytest.fixture
def write_options() -> dict[str, object]:
    return {"name": "synth", "num_shards": 4, "seed": 1}


def test_pieces_of_whole_records_give_one_line_of_offset_and_framed_size_each() -> None:
    records = [b"a", b"", b"x" * 300]
    pieces = [b"".join(frame([r])) for r in records]
    index = RecordIndex()
    index.feed(pieces[0])
    index.feed(memoryview(pieces[1] + pieces[2]))
    assert index.records == 3
    assert index.to_bytes() == b"0 17\n17 16\n33 316\n"
    assert index_bytes(b"".join(pieces)) == index.to_bytes()
    assert index_bytes(b"") == b""


def test_a_piece_that_cuts_a_record_is_refused_with_its_offset() -> None:
    data = b"".join(frame([b"abc"])) + b"".join(frame([b"defg"]))
    with pytest.raises(ValueError, match="record at byte 19: 20 bytes run past the piece"):
        RecordIndex().feed(data[:-1])


def test_index_files_equal_tfrecord2idx_and_the_tfrecord_package_reads_through_them(
    write_set: Callable[..., Manifest], raw: Path, tmp_path: Path, loop: str
) -> None:
    manifest = write_set(raw, tmp_path / "out")
    root = Path(manifest.root)
    names = [s.name.removesuffix(".tfrecord") for s in manifest.shards]
    got = _read_with_tfrecord(manifest.root, names, tmp_path)
    records: dict[str, list[str]] = got["sequential"]
    for shard, name in zip(manifest.shards, names, strict=True):
        ours = (root / layout.INDEX.path(shard.name)).read_bytes()
        assert ours == (tmp_path / f"{name}.idx").read_bytes()  # what tfrecord2idx wrote
        assert ours.count(b"\n") == shard.records == len(records[name])
        assert shard.index_sha256 == hashlib.sha256(ours).hexdigest()
        parts = got["parts"][name]
        assert [r for part in parts for r in part] == records[name] and all(parts)
    # Every record once through the index files, each the bytes of its file.
    assert len(got["multi"]) == manifest.records == 40
    for path, label, image_sha in got["multi"]:
        assert image_sha == hashlib.sha256((raw / path).read_bytes()).hexdigest()
        assert manifest.labels[label] == path.split("/")[0]
    assert len({path for path, _, _ in got["multi"]}) == 40


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
def test_compressed_shards_get_no_index_file(
    write_set: Callable[..., Manifest], raw: Path, tmp_path: Path, compression: str
) -> None:
    manifest = write_set(raw, tmp_path / "out", compression=compression)
    assert not (Path(manifest.root) / layout.INDEX.folder).exists()
    assert all(s.index_sha256 is None for s in manifest.shards)
    assert validate(ValidateConfig(f"{manifest.root}/{MANIFEST_NAME}")).ok


def test_validate_reports_a_tampered_and_a_missing_index_file(
    write_set: Callable[..., Manifest], raw: Path, tmp_path: Path
) -> None:
    manifest = write_set(raw, tmp_path / "out")
    url = f"{manifest.root}/{MANIFEST_NAME}"
    assert validate(ValidateConfig(url)).ok
    first, second = (Path(manifest.root) / layout.INDEX.path(s.name) for s in manifest.shards[:2])
    text = first.read_bytes()
    first.write_bytes(text.replace(b" ", b"  ", 1))  # same records, one byte more
    second.unlink()
    report = validate(ValidateConfig(url))
    found = hashlib.sha256(text.replace(b" ", b"  ", 1)).hexdigest()
    assert [str(p) for p in report.problems] == [
        f"index/{manifest.shards[0].name}.idx: sha256 mismatch: "
        f"expected {manifest.shards[0].index_sha256}, found {found}",
        f"index/{manifest.shards[1].name}.idx: missing: "
        f"expected the record index of {manifest.shards[1].name}",
    ]
    assert report.problem_count == 2


def test_a_resumed_write_reuses_shards_and_writes_their_missing_or_damaged_index(
    write_set: Callable[..., Manifest], raw: Path, tmp_path: Path
) -> None:
    first = write_set(raw, tmp_path / "out")
    version = Path(first.root)
    index = {s.name: (version / layout.INDEX.path(s.name)).read_bytes() for s in first.shards}
    # A write stopped before its manifest, one index file gone and one damaged.
    (version / MANIFEST_NAME).unlink()
    (version / layout.INDEX.path(first.shards[0].name)).unlink()
    (version / layout.INDEX.path(first.shards[1].name)).write_bytes(b"0 1\n")
    config = WriteConfig(out=str(tmp_path / "out"), name="synth", num_shards=4, seed=1)
    again = write(config, list_files(str(raw)), progress=False)
    assert again.reused == 4 and again.manifest == first
    assert {n: (version / layout.INDEX.path(n)).read_bytes() for n in index} == index
    assert validate(ValidateConfig(f"{first.root}/{MANIFEST_NAME}")).ok
