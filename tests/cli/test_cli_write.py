"""`tfshards write --old-versions remove`: the out keeps the version just written, and only it."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfshards import storage
from tfshards.cli import app
from tfshards.listing.listing import list_files, write_listing
from tfshards.project.sample import SyntheticSpec, render_synthetic
from tfshards.shardset import lease


@pytest.fixture
def listing_dir(make_raw: Callable[..., Path], tmp_path: Path) -> Path:
    write_listing(list_files(str(make_raw(12, 16, classes=2))), str(tmp_path / "listing"))
    return tmp_path / "listing"


def _write(listing_dir: Path, out: Path, *options: str) -> tuple[int, str]:
    manifest = str(out.parent / "manifest.json")
    args = ["write", str(listing_dir), "--out", str(out), "--manifest", manifest]
    args += ["--num-shards", "2", *options]
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.stdout + result.stderr


def _versions(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.is_dir())


def _dvc(cwd: Path, *args: str) -> None:
    dvc = str(Path(sys.executable).with_name("dvc"))
    subprocess.run([dvc, *args, "-q"], cwd=cwd, check=True, capture_output=True)


def test_remove_leaves_only_the_new_version_and_names_what_it_deleted(listing_dir, tmp_path):
    """In a DVC project whose cache holds the old version (``dvc add``, as ``dvc repro``
    saves a stage's outs)."""
    out = tmp_path / "shards"
    _dvc(tmp_path, "init", "--no-scm")
    assert _write(listing_dir, out, "--seed", "1")[0] == 0
    (first,) = _versions(out)
    _dvc(tmp_path, "add", "shards")
    code, said = _write(listing_dir, out, "--seed", "2", "--old-versions", "remove")
    assert code == 0, said
    (second,) = _versions(out)
    assert second != first
    assert f"old_versions remove: deleted 1 other version ({first})" in said


@pytest.mark.parametrize("project", [True, False], ids=["dvc-project", "no-dvc"])
def test_remove_keeps_a_version_no_dvc_cache_holds(listing_dir, tmp_path, project):
    """A version written by hand into the out exists nowhere else: removing it lost data
    for good."""
    out = tmp_path / "shards"
    if project:
        _dvc(tmp_path, "init", "--no-scm")
    assert _write(listing_dir, out, "--seed", "1")[0] == 0
    (first,) = _versions(out)
    code, said = _write(listing_dir, out, "--seed", "2", "--old-versions", "remove")
    assert code == 0, said
    assert first in _versions(out) and len(_versions(out)) == 2
    assert (
        f"warning: old_versions remove: kept {first}: DVC's cache does not hold it (written "
        "outside `dvc repro`?), so it exists nowhere else; `tfshards prune --delete` removes it"
    ) in said


def test_remove_keeps_a_version_holding_a_users_file_and_says_so(listing_dir, tmp_path):
    out = tmp_path / "shards"
    assert _write(listing_dir, out, "--seed", "1")[0] == 0
    (first,) = _versions(out)
    (out / first / "my-eval.txt").write_text("mine")
    code, said = _write(listing_dir, out, "--seed", "2", "--old-versions", "remove")
    assert code == 0, said
    assert (out / first / "my-eval.txt").read_text() == "mine"
    assert (
        f"warning: old_versions remove: kept {first}: holds a file tfshards did not write "
        "(my-eval.txt), so it stays" in said
    )


def test_keep_is_the_default_and_keeps_every_version(listing_dir, tmp_path):
    out = tmp_path / "shards"
    for seed in ("1", "2"):
        assert _write(listing_dir, out, "--seed", seed)[0] == 0
    assert len(_versions(out)) == 2


def test_remove_never_touches_what_tfshards_did_not_write_or_a_version_being_written(
    listing_dir, tmp_path
):
    out = tmp_path / "shards"
    assert _write(listing_dir, out, "--seed", "1")[0] == 0
    (busy,) = _versions(out)
    foreign = out / "0123456789abcdef"  # named like a version, but no manifest: not finished
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    (out / "photos").mkdir()
    with lease.hold(
        storage.open_url(str(out))[0], str(out / busy)
    ):  # a writer re-writing the first version
        code, said = _write(listing_dir, out, "--seed", "2", "--old-versions", "remove")
    assert code == 0, said
    assert busy in _versions(out) and (foreign / "notes.txt").read_text() == "mine"
    assert (out / "photos").is_dir() and "deleted" not in said


def test_remove_takes_the_folder_of_a_write_that_failed_on_a_file(make_raw, tmp_path):
    """The failed write's folder has no manifest and no writer: left, DVC recorded it in
    the out with the version (and `git add` + `dvc push` sent it on)."""
    raw = make_raw(12, 16, classes=2)
    bad = sorted(raw.rglob("*.jpg"))[3]
    good = bad.read_bytes()
    bad.write_bytes(b"not an image")
    listing, out = tmp_path / "listing", tmp_path / "shards"
    write_listing(list_files(str(raw)), str(listing))
    code, said = _write(listing, out, "--old-versions", "remove")
    assert code == 1, said
    (failed,) = _versions(out)
    bad.write_bytes(good)
    write_listing(list_files(str(raw)), str(listing))
    code, said = _write(listing, out, "--old-versions", "remove")
    assert code == 0, said
    (kept,) = _versions(out)
    assert kept != failed and f"deleted 1 other version ({failed})" in said


def test_a_value_other_than_keep_or_remove_is_one_line(listing_dir, tmp_path):
    code, said = _write(listing_dir, tmp_path / "shards", "--old-versions", "purge")
    assert code == 1
    assert said.strip() == (
        "error: old_versions: expected one of ('keep', 'remove'), got 'purge'"
    ), said
    assert not (tmp_path / "shards").exists()


def test_a_file_changed_since_the_listing_is_a_warning_naming_it(make_raw, tmp_path):
    raw = make_raw(12, 16, classes=2)
    write_listing(list_files(str(raw)), str(tmp_path / "listing"))
    changed = sorted(raw.rglob("*.jpg"))[3]
    changed.write_bytes(changed.read_bytes() + b"more")
    code, said = _write(tmp_path / "listing", tmp_path / "out", "--on-error", "skip")
    assert code == 0, said
    rel = changed.relative_to(raw).as_posix()
    assert (
        f"warning: 1 file changed since the listing (first: {rel}) and left out; run "
        "`tfshards list` again"
    ) in said.splitlines()


def test_an_older_params_near_duplicates_still_runs_with_a_line_saying_where_it_went(
    listing_dir, tmp_path
):
    """DVC passes ``--near-duplicates`` from an older params.yaml's write.near_duplicates:
    the write runs, hashes nothing, names the same version, and says where the check is."""
    code, said = _write(listing_dir, tmp_path / "a" / "shards", "--near-duplicates")
    assert code == 0, said
    assert "warning: write.near_duplicates is no longer write's" in said
    assert "validate.near_duplicates" in said and "tfshards init --force" in said
    code, plain = _write(listing_dir, tmp_path / "b" / "shards")
    assert code == 0 and "near_duplicates" not in plain
    assert _versions(tmp_path / "a" / "shards") == _versions(tmp_path / "b" / "shards")
    (version,) = _versions(tmp_path / "a" / "shards")
    assert not (tmp_path / "a" / "shards" / version / "phash.bin").exists()
    help_text = CliRunner().invoke(app, ["write", "--help"]).stdout
    assert "near-duplicates" not in help_text


def test_remove_is_refused_where_the_shards_are_not_on_local_disk(listing_dir, tmp_path):
    """Nothing keeps a remote store's old versions (DVC's cache holds a local folder's)."""
    code, said = _write(
        listing_dir, tmp_path / "x", "--out", "memory://shards/set", "--old-versions", "remove"
    )
    assert code == 1
    assert said.strip().splitlines() == [
        "error: old_versions remove: memory://shards/set is not local disk, so nothing would "
        "keep the versions it deletes (DVC's cache keeps those of a local shard folder only): "
        "use keep, and `tfshards prune` to delete versions you no longer need"
    ]


def test_a_shard_changed_in_place_after_its_version_was_written_is_refused_not_kept(
    listing_dir, tmp_path
):
    """Same size, other bytes (a hand, a tool): a re-run that changes nothing had kept the
    version as it is, and DVC, running the stage again for its changed output, recorded
    the damaged folder in dvc.lock."""
    import shutil

    out = tmp_path / "shards"
    assert _write(listing_dir, out)[0] == 0
    (version,) = _versions(out)
    shard = sorted((out / version).glob("*.tfrecord"))[1]
    os.utime(shard)  # touched, not changed: kept
    code, said = _write(listing_dir, out)
    assert code == 0 and "kept it as it is" in said, said
    copy = tmp_path / "copy" / "shards"  # as DVC checks out copies: every file dated now,
    shutil.copytree(out, copy, copy_function=shutil.copyfile)  # shards after the manifest
    shutil.copyfile(tmp_path / "manifest.json", copy.parent / "manifest.json")
    code, said = _write(listing_dir, copy)  # each read once: kept
    assert code == 0 and "kept it as it is" in said, said
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    good = hashlib.sha256(shard.read_bytes()).hexdigest()
    shard.write_bytes(bytes(data))
    code, said = _write(listing_dir, out)
    assert code == 1
    assert said == (
        f"error: {shard}: changed since version {version} was written: expected sha256 "
        f"{good}, found {hashlib.sha256(data).hexdigest()}; nothing written: restore it "
        "(`dvc checkout --force`: DVC's cache holds the version as written, unless its "
        "cache.type links the file there too, then `dvc pull`; or a copy), or set "
        "write.previous: none (--previous none) to write every shard anew as a new lineage\n"
    )


def test_a_shard_changed_in_place_lends_nothing_and_each_newer_shard_is_read_once(
    make_raw, tmp_path, monkeypatch
):
    """Growing, a damaged shard had been linked into the new version unread; a shard dated
    after its manifest (a checkout of copies) is read once, not on every run."""
    from tfshards.listing import contenthash, hashcache

    raw = make_raw(12, 16, classes=2)
    listing = tmp_path / "listing"
    write_listing(list_files(str(raw)), str(listing))
    out = tmp_path / "shards"
    assert _write(listing, out)[0] == 0
    (version,) = _versions(out)
    shards = sorted((out / version).glob("*.tfrecord"))
    read: list[str] = []
    real = contenthash.hash_local

    def hash_local(batches, threads):  # type: ignore[no-untyped-def]
        read.extend(folder + name for folder, _, names in batches for name in names)
        return real(batches, threads)

    monkeypatch.setattr(contenthash, "hash_local", hash_local)
    monkeypatch.setattr(hashcache, "RACY_NS", 0)  # remembered though written just now
    for shard in shards:
        shard.write_bytes(shard.read_bytes())  # the same bytes, dated after the manifest
    for _ in range(2):
        code, said = _write(listing, out)
        assert code == 0 and "kept it as it is" in said, said
        assert len(read) == len(shards)  # each read the first time only
    data = bytearray(shards[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    shards[0].write_bytes(bytes(data))
    spec = SyntheticSpec(2, 16, classes=1, seed=9)
    for i in range(2):  # new files: the write would grow from the damaged version
        (raw / "00" / f"new{i}.jpg").write_bytes(render_synthetic(spec, i))
    write_listing(list_files(str(raw)), str(listing))
    code, said = _write(listing, out)
    assert code == 1 and said.startswith(f"error: {shards[0]}: changed since version {version}")
    assert _versions(out) == [version]  # no version grown from it


def test_a_previous_version_missing_a_shard_is_written_again_or_named_as_it_lends_none(
    listing_dir, tmp_path
):
    out = tmp_path / "shards"
    assert _write(listing_dir, out, "--seed", "1")[0] == 0
    (first,) = _versions(out)
    shard = sorted((out / first).glob("*.tfrecord"))[0]
    shard.unlink()
    code, said = _write(listing_dir, out, "--seed", "1")  # the same data: the same version
    assert code == 0, said
    again = f"the previous version {first} lacks shard {shard.name}: wrote it again"
    assert again in said
    assert shard.is_file()
    shard.unlink()
    code, said = _write(listing_dir, out, "--seed", "2")  # it would lend nothing anyway
    assert code == 0, said
    assert (
        "not grown from the previous version: seed 1 -> 2 differs" in said and "lacks" not in said
    )


def test_a_manifest_path_that_is_a_folder_or_a_fifo_is_one_line(listing_dir, tmp_path):
    (tmp_path / "folder.json").mkdir()
    os.mkfifo(tmp_path / "fifo.json")
    for name, kind in (("folder.json", "a folder"), ("fifo.json", "a FIFO")):
        args = ["write", str(listing_dir), "--out", str(tmp_path / "s"), "--previous", "none"]
        result = CliRunner().invoke(app, [*args, "--manifest", str(tmp_path / name)])
        assert result.exit_code == 1
        assert result.stderr.strip() == (
            f"error: {tmp_path / name}: expected a regular file, found {kind} (EINVAL)"
        )


def test_a_file_name_holding_a_newline_stays_on_the_error_line(tmp_path, make_raw):
    """A name cannot split the error into lines that read as other messages."""
    raw = make_raw(4, 8, classes=2)
    label = sorted(p for p in raw.iterdir() if p.is_dir())[0]
    (label / "evil\nerror: all good\n.jpg").write_bytes(b"hello world text")
    listing = tmp_path / "listing"
    assert CliRunner().invoke(app, ["list", str(raw), "--out", str(listing)]).exit_code == 0
    code, said = _write(listing, tmp_path / "shards")
    assert code == 1
    (line,) = said.strip().splitlines()
    assert line.startswith("error: ") and "evil\\nerror: all good\\n.jpg: expected an image" in line
