"""The manifest: a relative root is found from the manifest's own place, and every field is checked.

Each case plants its fault in a real manifest file on disk and runs the real
command (``python -m tfshards`` in another working directory, or the typer
app) and :func:`tfshards.shardset.manifest.load`, as the loader and training use it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tfshards.cli import app
from tfshards.errors import InputError
from tfshards.listing.listing import Listing, list_files
from tfshards.project.sample import write_synthetic
from tfshards.shardset.layout import MANIFEST_NAME
from tfshards.shardset.manifest import load
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

OLD = 1_000_000_000  # an mtime long past: every version is old enough to prune


@pytest.fixture
def listing(tmp_path: Path) -> Listing:
    write_synthetic(str(tmp_path / "raw"), 12, 16, classes=3, workers=1)
    return list_files(str(tmp_path / "raw"))


def _write_in(project: Path, listing: Listing, seed: int, monkeypatch: pytest.MonkeyPatch) -> str:
    """Write as a DVC stage does: from the project folder, relative out and manifest copy."""
    project.mkdir(exist_ok=True)
    monkeypatch.chdir(project)
    config = WriteConfig(
        out="data/shards",
        num_shards=2,
        seed=seed,
        executor="serial",
        manifest_copy="data/manifest.json",
    )
    manifest = write(config, listing, progress=False).manifest
    monkeypatch.chdir(project.parent)
    for path in [project, *project.rglob("*")]:
        os.utime(path, (OLD, OLD))
    return manifest.fingerprint


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tfshards", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _versions(project: Path) -> set[str]:
    return {p.name for p in (project / "data/shards").iterdir()}


# ----------------------------------------------------------------------------- root


def test_prune_from_another_clone_deletes_nothing_of_the_callers_clone(
    listing, tmp_path, monkeypatch
):
    a = tmp_path / "A"
    stale = _write_in(a, listing, 3, monkeypatch)
    current_a = _write_in(a, listing, 1, monkeypatch)
    b = tmp_path / "B"
    shutil.copytree(a, b)  # a clone: the same relative root in its copy of the manifest
    current_b = _write_in(b, listing, 2, monkeypatch)
    assert (a / "data/manifest.json").read_bytes() != (b / "data/manifest.json").read_bytes()

    done = _cli(b, "prune", "--manifest", "../A/data/manifest.json", "--delete")
    assert done.returncode == 0, done.stderr
    assert _versions(b) == {stale, current_a, current_b}  # the caller's clone untouched
    assert _versions(a) == {current_a}  # A's own location pruned, its current version kept
    assert f"{a / 'data/shards'}: 2 versions, 1 kept, deleted 1" in done.stdout


def test_validate_and_load_find_the_version_from_the_manifests_place_not_the_cwd(
    listing, tmp_path, monkeypatch
):
    a = tmp_path / "A"
    fingerprint = _write_in(a, listing, 1, monkeypatch)
    version = a / "data/shards" / fingerprint
    elsewhere = tmp_path / "elsewhere" / "data" / "shards" / fingerprint
    elsewhere.mkdir(parents=True)  # a same-named empty folder under the caller's cwd
    for manifest in ("../A/data/manifest.json", f"../A/data/shards/{fingerprint}/manifest.json"):
        done = _cli(tmp_path / "elsewhere", "validate", manifest)
        assert done.returncode == 0, done.stderr
        assert " in 2 shards " in done.stdout and done.stdout.strip().endswith(": OK")
    monkeypatch.chdir(tmp_path / "elsewhere")
    for manifest in ("../A/data/manifest.json", str(version / MANIFEST_NAME)):
        found = load(manifest)
        assert found.directory == str(version)
        assert found.root == f"data/shards/{fingerprint}"  # the bytes keep the writer's spelling
        assert found.shard_url(found.shards[0]) == str(version / found.shards[0].name)


def test_the_loader_reads_a_copys_shards_from_another_working_directory(
    listing, tmp_path, monkeypatch
):
    from tfshards.reading import loader  # TensorFlow: only this test

    fingerprint = _write_in(tmp_path / "A", listing, 1, monkeypatch)
    (tmp_path / "B/data/shards" / fingerprint).mkdir(parents=True)  # same name, empty, under cwd
    monkeypatch.chdir(tmp_path / "B")
    manifest = load("../A/data/manifest.json")
    ds = loader.make_dataset(
        manifest.shards, manifest, batch_size=4, training=False, features=["path"]
    )
    got = sorted(
        (path.decode(), int(label))
        for inputs, labels in ds
        for path, label in zip(inputs["path"].numpy(), labels.numpy(), strict=True)
    )
    want = sorted((e.path, e.label) for e in listing.entries)
    assert got == want
    assert all(path.split("/")[0] == manifest.labels[label] for path, label in got)


def test_a_moved_version_directory_is_found_from_its_own_manifest(listing, tmp_path, monkeypatch):
    fingerprint = _write_in(tmp_path / "A", listing, 1, monkeypatch)
    moved = tmp_path / "archive" / fingerprint
    shutil.move(tmp_path / "A/data/shards" / fingerprint, moved)
    assert load(str(moved / MANIFEST_NAME)).directory == str(moved)
    assert CliRunner().invoke(app, ["validate", str(moved / MANIFEST_NAME)]).exit_code == 0


def test_a_version_directory_copied_under_another_name_is_its_own_root(
    listing, tmp_path, monkeypatch
):
    """`cp -r data/shards/<version> /elsewhere/tamper`: the shards beside the manifest are
    checked (the folder's name, not the version's, is the one problem left)."""
    fingerprint = _write_in(tmp_path / "A", listing, 1, monkeypatch)
    renamed = tmp_path / "elsewhere" / "tamper"
    shutil.copytree(tmp_path / "A/data/shards" / fingerprint, renamed)
    assert load(str(renamed / MANIFEST_NAME)).directory == str(renamed)
    checked = CliRunner().invoke(app, ["validate", str(renamed / MANIFEST_NAME)])
    assert (
        f"expected the fingerprint tamper (its version folder's name), found '{fingerprint}'"
        in (checked.output)
    )
    assert ": 1 problem in " in checked.output
    (renamed / load(str(renamed / MANIFEST_NAME)).shards[1].name).write_bytes(b"tampered")
    checked = CliRunner().invoke(app, ["validate", str(renamed / MANIFEST_NAME)])
    assert "data-00001-of-00002.tfrecord: size mismatch: expected" in checked.output
    assert checked.exit_code == 1 and "Traceback" not in checked.output


def test_a_version_directory_copied_inside_the_project_is_its_own_root_not_the_original(
    listing, tmp_path, monkeypatch
):
    """`cp -r data/shards/<version> backup/mycopy` in the project: the lookup above the copy
    found the original first, so a damaged copy validated (the original) OK."""
    fingerprint = _write_in(tmp_path / "A", listing, 1, monkeypatch)
    copy = tmp_path / "A" / "backup" / "mycopy"
    shutil.copytree(tmp_path / "A/data/shards" / fingerprint, copy)
    assert load(str(copy / MANIFEST_NAME)).directory == str(copy)
    first = load(str(copy / MANIFEST_NAME)).shards[0].name
    (copy / first).write_bytes(b"cut")
    checked = CliRunner().invoke(app, ["validate", str(copy / MANIFEST_NAME), "--no-progress"])
    assert checked.exit_code == 1 and f"{first}: size mismatch: expected" in checked.output
    # Its first shard gone too: still the copy (its other files say so), one shard missing.
    (copy / first).unlink()
    checked = CliRunner().invoke(app, ["validate", str(copy / MANIFEST_NAME), "--no-progress"])
    assert checked.exit_code == 1 and f"{first}: missing" in checked.output, checked.output
    # The manifest copy alone (no shard beside it) still finds the version above it.
    assert load(str(tmp_path / "A/data/manifest.json")).fingerprint == fingerprint


def test_a_copy_of_a_version_written_to_an_absolute_out_is_read_for_itself(listing, tmp_path):
    """An absolute root was taken as is: a copy (even under the version's own name)
    validated, and showed, the original."""
    config = WriteConfig(out=str(tmp_path / "abs_shards"), num_shards=2, executor="serial")
    manifest = write(config, listing, progress=False).manifest
    copy = tmp_path / "backup" / manifest.fingerprint
    shutil.copytree(manifest.directory, copy)
    assert load(str(copy / MANIFEST_NAME)).directory == str(copy)
    (copy / manifest.shards[1].name).unlink()
    checked = CliRunner().invoke(app, ["validate", str(copy / MANIFEST_NAME), "--no-progress"])
    assert checked.exit_code == 1 and f"{manifest.shards[1].name}: missing" in checked.output
    assert load(os.path.join(manifest.directory, MANIFEST_NAME)).directory == manifest.directory


def test_a_manifest_copy_beside_a_users_file_named_like_tfds_metadata_finds_its_version(
    listing, tmp_path, monkeypatch
):
    """data/label.labels.txt of the user's made data/ pass for a version folder (by name)."""
    fingerprint = _write_in(tmp_path / "A", listing, 1, monkeypatch)
    (tmp_path / "A/data/label.labels.txt").write_text("00\n01\n")
    found = load(str(tmp_path / "A/data/manifest.json"))
    assert found.fingerprint == fingerprint and found.directory.endswith(f"shards/{fingerprint}")


def test_a_folder_given_as_the_manifest_is_read_through_the_manifest_in_it(
    listing, tmp_path, monkeypatch
):
    """A version directory (or a manifest copy's folder) where a manifest is asked: its
    manifest.json, as `tfshards diff` takes them; a folder without one is one line."""
    fingerprint = _write_in(tmp_path / "A", listing, 1, monkeypatch)
    version = tmp_path / "A/data/shards" / fingerprint
    assert load(str(version)).fingerprint == fingerprint
    assert load(str(tmp_path / "A/data")).fingerprint == fingerprint  # the copy's folder
    result = CliRunner().invoke(app, ["validate", str(version), "--no-progress"])
    assert result.exit_code == 0, result.output
    with pytest.raises(InputError) as no_manifest:
        load(str(tmp_path / "A/data/shards"))
    assert (
        str(no_manifest.value) == f"{tmp_path}/A/data/shards: a folder with no manifest.json in it"
    )
    failed = CliRunner().invoke(app, ["show", str(tmp_path / "A/data/shards"), "x.png"])
    assert failed.exit_code == 1 and "Traceback" not in failed.output
    assert failed.output.strip().endswith("a folder with no manifest.json in it")


def test_a_copy_whose_version_is_nowhere_above_it_fails_in_one_line(listing, tmp_path, monkeypatch):
    a = tmp_path / "A"
    fingerprint = _write_in(a, listing, 1, monkeypatch)
    (a / ".git").mkdir()  # the project's top: the search stops here
    shutil.move(a / "data", tmp_path / "data")  # the version is above the top now
    shutil.move(tmp_path / "data/manifest.json", a / "manifest.json")
    expected = f"root: expected the version directory data/shards/{fingerprint} "
    with pytest.raises(InputError, match=expected):
        load(str(a / "manifest.json"))
    done = _cli(tmp_path, "validate", "A/manifest.json")
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"error: A/manifest.json: {expected}")


# ----------------------------------------------------------------------------- fields

Edit = Callable[[dict[str, Any]], None]


def _shard(i: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda doc: doc["shards"][i]


CASES: dict[str, tuple[Edit, str]] = {
    "parent path": (
        lambda doc: _shard(0)(doc).update(name="../../../../../../etc/passwd"),
        "shards[0].name: expected a plain file name inside the version directory, "
        "found '../../../../../../etc/passwd'",
    ),
    "absolute path": (
        lambda doc: _shard(1)(doc).update(name="/etc/passwd"),
        "shards[1].name: expected a plain file name inside the version directory",
    ),
    "another pattern": (
        lambda doc: _shard(0)(doc).update(name="passwd"),
        "shards[0].name: expected a shard name data-NNNNN-of-00002.tfrecord "
        "(NNNNN below 2), found 'passwd'",
    ),
    "another count": (
        lambda doc: _shard(1)(doc).update(name="data-00001-of-00003.tfrecord"),
        "shards[1].name: expected a shard name data-NNNNN-of-00002.tfrecord",
    ),
    "listed twice": (
        lambda doc: doc["shards"].__setitem__(1, dict(doc["shards"][0])),
        "shards[1].name: expected each shard once (shards[0] is), "
        "found 'data-00000-of-00002.tfrecord'",
    ),
    "non-hex sha256": (
        lambda doc: _shard(0)(doc).update(sha256="zz" * 32),
        f"shards[0].sha256: expected a sha256 (64 lowercase hex digits), found '{'zz' * 32}'",
    ),
    "short index sha256": (
        lambda doc: _shard(1)(doc).update(index_sha256="abc"),
        "shards[1].index_sha256: expected a sha256 (64 lowercase hex digits), found 'abc'",
    ),
    "negative records": (
        lambda doc: _shard(0)(doc).update(records=-1),
        "shards[0].records: expected a non-negative integer, found -1",
    ),
    "bytes as text": (
        lambda doc: _shard(0)(doc).update(bytes="12"),
        "shards[0].bytes: expected a non-negative integer, found '12'",
    ),
    "missing records": (
        lambda doc: _shard(1)(doc).pop("records"),
        "shards[1].records: expected a non-negative integer, found nothing",
    ),
    "reversed labels": (
        lambda doc: doc["labels"].reverse(),
        "labels: expected unique names, sorted as the listing holds them, found ['02', '01', '00']",
    ),
    "duplicate label": (
        lambda doc: doc["labels"].__setitem__(1, "00"),
        "labels: expected unique names, sorted as the listing holds them",
    ),
    "label not a string": (
        lambda doc: doc["labels"].__setitem__(0, 0),
        "labels: expected a list of non-empty strings, found [0, '01', '02']",
    ),
    "metadata outside": (
        lambda doc: doc["metadata_files"].update({"../../x": "0" * 64}),
        "metadata_files: expected paths inside the version directory, found '../../x'",
    ),
    "unknown compression": (
        lambda doc: doc.update(compression="lz4"),
        "compression: expected one of ('none', 'gzip', 'zlib'), found 'lz4'",
    ),
    "fingerprint not hex": (
        lambda doc: doc.update(fingerprint="../x"),
        "fingerprint: expected 16 lowercase hex digits, found '../x'",
    ),
    "root missing": (
        lambda doc: doc.pop("root"),
        "root: expected the version directory's path or URL, found nothing",
    ),
    "listed negative": (
        lambda doc: doc["totals"].update(listed=-5),
        "totals.listed: expected a non-negative integer, found -5",
    ),
}


@pytest.fixture
def written(listing: Listing, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    _write_in(tmp_path / "A", listing, 1, monkeypatch)
    return tmp_path / "A"


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_planted_manifest_fault_is_one_line_naming_the_field(case, written, monkeypatch):
    edit, expected = CASES[case]
    manifest = written / "data/manifest.json"
    doc = json.loads(manifest.read_bytes())
    edit(doc)
    manifest.write_text(json.dumps(doc))
    monkeypatch.chdir(written)
    for command in (["validate", "data/manifest.json"], ["prune", "--delete"]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 1, result.output
        assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1
        assert result.stderr.startswith(f"error: data/manifest.json: {expected}"), result.stderr
    with pytest.raises(InputError, match=r"^[^\n]+$") as caught:
        load(str(manifest))  # what the loader and training read
    assert expected in str(caught.value) and caught.value.path == str(manifest)
    assert (written / "data/shards").exists()  # prune deleted nothing


def test_labels_renamed_in_the_manifest_alone_fail_validate(written):
    manifest = written / "data/manifest.json"
    doc = json.loads(manifest.read_bytes())
    doc["labels"][2] = "cat"  # still sorted and unique: only the tfds label file tells
    manifest.write_text(json.dumps(doc))
    result = CliRunner().invoke(app, ["validate", str(manifest)])
    assert result.exit_code == 1
    assert (
        "manifest.json: labels: expected the 3 names of label.labels.txt, found 3 "
        "(from label 2: ['02'] in the file, ['cat'] here)"
    ) in result.output


@pytest.mark.parametrize(
    ("doc", "found"),
    [
        (
            {"version": 2, "files": 3, "files_sha256": "0" * 64, "labels": ["a"]},
            "found a listing's meta.json (`tfshards list` writes it; `tfshards write` makes "
            "a manifest from it)",
        ),
        ([1, 2], "found JSON of type list"),
        ({"version": 1, "ok": True}, "found JSON with keys ok, version"),
    ],
)
def test_a_json_file_that_is_no_manifest_says_what_it_is(tmp_path, doc, found):
    path = tmp_path / "meta.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as info:
        load(str(path))
    assert str(info.value).startswith(f"{path}: expected a shard set's manifest.json")
    assert str(info.value).endswith(found)


def test_a_link_to_a_manifest_copy_in_another_folder_finds_the_version(
    listing, tmp_path, monkeypatch
):
    fingerprint = _write_in(tmp_path / "A", listing, 1, monkeypatch)
    elsewhere = tmp_path / "B"
    elsewhere.mkdir()
    (elsewhere / "link.json").symlink_to(tmp_path / "A/data/manifest.json")
    found = load(str(elsewhere / "link.json"))
    assert found.directory == str(tmp_path / "A/data/shards" / fingerprint)
    monkeypatch.chdir(elsewhere)
    assert CliRunner().invoke(app, ["validate", "link.json", "--metrics", "v.json"]).exit_code == 0
