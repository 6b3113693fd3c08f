"""``tfshards diff``: the summary, the metrics file, the forms of OLD/NEW, one-line errors."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfshards.cli import app
from tfshards.cli.diff import manifest_url
from tfshards.shardset import layout, members
from tfshards.shardset.manifest import Manifest, ShardInfo

runner = CliRunner()
OLD_NAME, NEW_NAME = "0123456789abcdef", "fedcba9876543210"


def tok(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def write_version(parent: Path, name: str, labels: Sequence[str], rows: list[tuple]) -> Path:
    """A version directory of one shard in bucket 0 (dummy bytes) and its member list."""
    directory = parent / name
    (directory / layout.RECORDS.folder).mkdir(parents=True)
    shard = layout.shard_name("data", 0, 1)
    (directory / shard).write_bytes(b"not a shard")
    data = members.encode(rows)
    Path(layout.records_path(str(directory), shard)).write_bytes(data)
    info = ShardInfo(shard, len(rows), 11, "0" * 64, None, 0, hashlib.sha256(data).hexdigest())
    manifest = Manifest(
        root=str(directory),
        fingerprint=name,
        params={"name": "data", "buckets": 1},
        schema=(),
        labels=tuple(labels),
        compression="none",
        shards=(info,),
        listed=len(rows),
    )
    (directory / layout.MANIFEST_NAME).write_bytes(manifest.to_json())
    return directory


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    """Two versions under ``tmp_path/shards``: 3 added, 1 removed, 1 changed, 1 relabeled."""
    out = tmp_path / "shards"
    old = [(f"cat/{i}.jpg", tok(f"c{i}"), 0) for i in range(4)] + [("dog/9.jpg", tok("d9"), 1)]
    new = [
        ("cat/0.jpg", tok("c0 v2"), 0),
        ("cat/1.jpg", tok("c1"), 1),
        ("cat/2.jpg", tok("c2"), 0),
        ("dog/9.jpg", tok("d9"), 1),
        *((f"dog/{i}.jpg", tok(f"d{i}"), 1) for i in range(3)),
    ]
    write_version(out, OLD_NAME, ("cat", "dog"), old)
    write_version(out, NEW_NAME, ("cat", "dog"), new)
    return out


def test_diff_prints_counts_and_paths_and_writes_metrics(shards: Path, tmp_path: Path) -> None:
    metrics = tmp_path / "results" / "diff.json"
    old, new = shards / OLD_NAME, shards / NEW_NAME
    args = ["diff", str(old / "manifest.json"), str(new), "--metrics", str(metrics)]
    result = runner.invoke(app, [*args, "--limit", "2"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"old: {old} (5 records, 1 shards)",
        f"new: {new} (7 records, 1 shards)",
        "records: 3 added, 1 removed, 1 changed, 1 relabeled, 2 unchanged",
        "records per label: cat -2, dog +4",
        "buckets: 0 records under the same path moved to another bucket",
        "added (3):",
        "  dog/0.jpg",
        "  dog/1.jpg",
        "  ... and 1 more",
        "removed (1):",
        "  cat/3.jpg",
        "changed (1):",
        "  cat/0.jpg",
        "relabeled (1):",
        "  cat/1.jpg",
    ]
    assert json.loads(metrics.read_text(encoding="utf-8")) == {
        "diff": {
            "added": 3,
            "removed": 1,
            "changed": 1,
            "relabeled": 1,
            "unchanged": 2,
            "labels_added": 0,
            "labels_removed": 0,
            "labels_emptied": 0,
            "ids_changed": 0,
            "moved_paths": 0,
            "moved_files": 0,
            "moved_buckets": 0,
        }
    }


def test_metrics_are_written_when_the_reader_of_the_lines_stops_early(
    shards: Path, tmp_path: Path
) -> None:
    """``tfshards diff ... --metrics F | head -1``: the pipe closes after a line, and the
    ~190 KB of paths that follow no longer fit in it (a pipe holds 64 KB)."""
    out = tmp_path / "many"
    added = [(f"cat/{i:06d}-a-long-enough-name.jpg", tok(str(i)), 0) for i in range(5000)]
    write_version(out, OLD_NAME, ("cat",), added[:1])
    write_version(out, NEW_NAME, ("cat",), added)
    metrics = tmp_path / "diff.json"
    args = ["diff", str(out / OLD_NAME), str(out / NEW_NAME), "--metrics", str(metrics)]
    args += ["--limit", "5000"]
    tfshards = Path(sys.executable).with_name("tfshards")
    proc = subprocess.run(
        ["bash", "-c", '"$0" "$@" | head -1', str(tfshards), *args],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.stdout.startswith("old: "), proc.stderr
    assert json.loads(metrics.read_text(encoding="utf-8"))["diff"]["added"] == 4999


def test_version_names_are_looked_up_under_out(shards: Path) -> None:
    result = runner.invoke(app, ["diff", OLD_NAME, NEW_NAME, "--out", str(shards), "--no-paths"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[2:] == [
        "records: 3 added, 1 removed, 1 changed, 1 relabeled, 2 unchanged",
        "records per label: cat -2, dog +4",
        "buckets: 0 records under the same path moved to another bucket",
    ]


def test_each_form_names_its_manifest(shards: Path, tmp_path: Path, monkeypatch) -> None:
    manifest = str(shards / OLD_NAME / "manifest.json")
    assert manifest_url(manifest, "x") == manifest
    assert manifest_url(str(shards / OLD_NAME), "x") == manifest
    assert manifest_url(OLD_NAME, str(shards)) == manifest
    assert manifest_url("memory://bucket/v/manifest.json", "x") == "memory://bucket/v/manifest.json"
    monkeypatch.chdir(shards)  # a version name that is a folder here is that folder
    assert manifest_url(OLD_NAME, "elsewhere") == f"{OLD_NAME}/manifest.json"


def _error(*args: str) -> str:
    result = runner.invoke(app, ["diff", *args])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_a_missing_member_list_is_one_line_naming_it(shards: Path) -> None:
    member_list = shards / NEW_NAME / "records" / "data-00000-of-00001.tfrecord.jsonl"
    member_list.unlink()
    line = _error(OLD_NAME, NEW_NAME, "--out", str(shards))
    assert line.startswith(f"error: {member_list}: member list not found")


def test_an_unreadable_or_missing_manifest_is_one_line(shards: Path) -> None:
    manifest = shards / OLD_NAME / "manifest.json"
    manifest.write_text("{not json", encoding="utf-8")
    line = _error(str(manifest), NEW_NAME, "--out", str(shards))
    assert line.startswith(f"error: {manifest}: not valid JSON (")
    missing = shards / "aaaaaaaaaaaaaaaa" / "manifest.json"
    assert _error("aaaaaaaaaaaaaaaa", NEW_NAME, "--out", str(shards)) == (
        f"error: {missing}: no version aaaaaaaaaaaaaaaa under {shards}; a version removed "
        f"from it (write.old_versions: remove) comes back with `dvc get . {shards} --rev REV "
        "-o DIR` (REV a commit that holds it), then `tfshards diff DIR/aaaaaaaaaaaaaaaa ...`"
    )
    (shards / "bbbbbbbbbbbbbbbb").mkdir()  # a folder without manifest: said as such
    assert _error("bbbbbbbbbbbbbbbb", NEW_NAME, "--out", str(shards)).endswith(
        "manifest.json: no version bbbbbbbbbbbbbbbb under " + str(shards) + "; a version "
        "removed from it (write.old_versions: remove) comes back with `dvc get . "
        + str(shards)
        + " --rev REV -o DIR` (REV a commit that holds it), then "
        "`tfshards diff DIR/bbbbbbbbbbbbbbbb ...`"
    )


def test_help_explains_the_forms_of_old_and_new() -> None:
    result = runner.invoke(app, ["diff", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "a version name (16 hex digits" in text
    assert "--metrics" in text and "--no-paths" in text and "--limit" in text


def test_two_versions_sharing_no_path_get_a_note(tmp_path: Path) -> None:
    """Two unrelated sets compare as all added and all removed: the note says so."""
    out = tmp_path / "shards"
    write_version(out, OLD_NAME, ("cat",), [("cat/0.jpg", tok("c0"), 0)])
    write_version(out, NEW_NAME, ("0",), [("0/a.png", tok("a"), 0), ("0/b.png", tok("b"), 0)])
    result = runner.invoke(app, ["diff", OLD_NAME, NEW_NAME, "--out", str(out), "--no-paths"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[2:4] == [
        "records: 2 added, 1 removed, 0 changed, 0 relabeled, 0 unchanged",
        "note: no path is in both versions: are they versions of one data set?",
    ]


def test_no_note_when_every_path_was_renamed(tmp_path: Path) -> None:
    """The same bytes under new names are moves, not another data set."""
    out = tmp_path / "shards"
    write_version(out, OLD_NAME, ("cat",), [("cat/0.jpg", tok("c0"), 0)])
    write_version(out, NEW_NAME, ("cat",), [("cat/x0.jpg", tok("c0"), 0)])
    result = runner.invoke(app, ["diff", OLD_NAME, NEW_NAME, "--out", str(out), "--no-paths"])
    assert result.exit_code == 0, result.output
    assert "note:" not in result.output and "moved: 1 file" in result.output


def test_a_renamed_label_folder_says_the_old_label_is_now_without_records(tmp_path: Path):
    """The label map keeps the old name's id (ids never move): "labels removed" stayed
    empty, though a model trained on it keeps an output for a class with no records."""
    out = tmp_path / "shards"
    write_version(
        out, OLD_NAME, ("cat", "dog"), [("cat/0.jpg", tok("c"), 0), ("dog/1.jpg", tok("d"), 1)]
    )
    new_rows = [("cat/0.jpg", tok("c"), 0), ("puppy/1.jpg", tok("d"), 2)]
    write_version(out, NEW_NAME, ("cat", "dog", "puppy"), new_rows)
    args = ["diff", OLD_NAME, NEW_NAME, "--out", str(out), "--no-paths"]
    result = runner.invoke(app, [*args, "--metrics", str(tmp_path / "d.json")])
    assert result.exit_code == 0, result.output
    assert "labels now without records: dog (their ids stay" in result.output
    assert json.loads((tmp_path / "d.json").read_text())["diff"]["labels_emptied"] == 1
