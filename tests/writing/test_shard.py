"""Writing one shard when the disk or the input is hostile: full, read-only, capped, huge files."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from handedits import edit_listing_line
from tfshards.cli import app
from tfshards.listing.listing import list_files, write_listing
from tfshards.project.sample import write_synthetic
from tfshards.shardset.manifest import Manifest
from tfshards.writing.fileproblem import MAX_FILE_BYTES


@pytest.fixture
def listing_dir(tmp_path: Path) -> Path:
    raw = tmp_path / "raw"
    write_synthetic(str(raw), 20, 64, classes=2, workers=1)  # ~6 KB each, 124 KB in all
    write_listing(list_files(str(raw)), str(tmp_path / "listing"))
    return tmp_path / "listing"


def _write(listing_dir: Path, out: Path, manifest: Path, *more: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        app,
        [
            *("write", str(listing_dir), "--out", str(out), "--manifest", str(manifest)),
            *("--no-progress", "--workers", "1", *more),
        ],
    )
    return result.exit_code, result.stderr


def _one_line(code: int, stderr: str) -> str:
    assert code == 1, stderr
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def test_a_full_disk_fails_on_one_line_naming_the_shard(listing_dir, tiny_disk, tmp_path, loop):
    code, stderr = _write(listing_dir, tiny_disk / "shards", tmp_path / "m.json")
    line = _one_line(code, stderr)
    assert line.startswith(f"error: {tiny_disk}/shards/")
    assert ".tfrecord" in line and line.endswith(": cannot write: No space left on device (ENOSPC)")
    assert not (tmp_path / "m.json").exists()
    assert not [p for p in tiny_disk.rglob(".*.tmp-*")]  # no temp file left behind


def test_a_read_only_output_fails_on_one_line_naming_the_shard(listing_dir, read_only, tmp_path):
    code, stderr = _write(listing_dir, read_only / "shards", tmp_path / "m.json")
    line = _one_line(code, stderr)
    assert line.startswith(f"error: {read_only}/shards")
    assert line.endswith(": cannot write: Read-only file system (EROFS)")


def test_a_read_only_manifest_copy_fails_on_one_line_naming_it(listing_dir, read_only, tmp_path):
    code, stderr = _write(listing_dir, tmp_path / "shards", read_only / "m.json")
    line = _one_line(code, stderr)
    assert line == f"error: {read_only}/m.json: cannot write: Read-only file system (EROFS)"


def _capped(limit: int) -> None:  # runs in the child before exec
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.parametrize("pure", ["0", "1"])
def test_a_file_size_limit_fails_on_one_line_naming_the_shard(listing_dir, tmp_path, pure):
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "tfshards", "write", str(listing_dir)),
            *("--out", str(tmp_path / "shards"), "--manifest", str(tmp_path / "m.json")),
            *("--num-shards", "1", "--no-progress", "--workers", "1"),
        ],
        capture_output=True,
        text=True,
        preexec_fn=lambda: _capped(32 << 10),  # the one shard is ~124 KB
        env={**os.environ, "TFSHARDS_PURE_PYTHON": pure},
        timeout=120,
    )
    line = _one_line(proc.returncode, proc.stderr)
    assert line.startswith(f"error: {tmp_path}/shards/")
    assert line.endswith("data-00000-of-00001.tfrecord: cannot write: File too large (EFBIG)")


@pytest.fixture(scope="module")
def huge_listing(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """20 images and a sparse 5 GB file, and their listing; the tests only read them.

    The listing is made while the file holds one byte, and its line given the 5 GB size
    after the file grew to it (hashing 5 GB of zeros would take ~20 s of CPU): the write
    must refuse the file from the listed size alone, before it reads it.
    """
    base = tmp_path_factory.mktemp("huge")
    raw = base / "raw"
    write_synthetic(str(raw), 20, 64, classes=2, workers=1)
    huge = raw / "00" / "huge.jpg"
    huge.write_bytes(b"x")
    listing = base / "listing"
    write_listing(list_files(str(raw)), str(listing))
    with open(huge, "wb") as f:  # sparse: costs no disk
        f.truncate(5 << 30)
    rows = (listing / "files.jsonl").read_bytes().split(b"\n")
    (line,) = [n for n, row in enumerate(rows) if b'"00/huge.jpg"' in row]
    edit_listing_line(listing, line, b'"size":1,', f'"size":{5 << 30},'.encode())
    return raw, listing


def test_a_5_gb_file_is_refused_before_it_is_read(huge_listing, tmp_path, loop):
    raw, listing_dir = huge_listing
    code, stderr = _write(listing_dir, tmp_path / "shards", tmp_path / "m.json")
    line = _one_line(code, stderr)
    assert line == (
        f"error: {raw}/00/huge.jpg: file too large: expected at most {MAX_FILE_BYTES} bytes, "
        f"found {5 << 30}; write.on_error: skip leaves such files out"
    )


def test_a_5_gb_file_is_a_reject_with_skip_and_the_rest_is_written(huge_listing, tmp_path, loop):
    _, listing_dir = huge_listing
    code, stderr = _write(
        listing_dir, tmp_path / "shards", tmp_path / "m.json", "--on-error", "skip"
    )
    assert code == 0, stderr
    manifest = Manifest.from_json((tmp_path / "m.json").read_bytes())
    assert [(r.path, r.reason) for r in manifest.rejected] == [
        ("00/huge.jpg", f"file too large: expected at most {MAX_FILE_BYTES} bytes, found {5 << 30}")
    ]
    assert manifest.records == 20
