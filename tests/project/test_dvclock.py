"""The write warns when the manifest it grows from is not the one dvc.lock records."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfshards.cli import app
from tfshards.listing.listing import list_files, write_listing
from tfshards.project import dvclock

LOCK = """schema: '2.0'
stages:
  write:
    cmd: tfshards write data/listing --out data/shards --manifest data/manifest.json
    outs:
    - path: data/manifest.json
      hash: md5
      md5: {md5}
      size: 10
    - path: data/shards
      hash: md5
      md5: 0123456789abcdef0123456789abcdef.dir
"""


def _lock(root: Path, content: bytes) -> None:
    (root / "dvc.lock").write_text(LOCK.format(md5=hashlib.md5(content).hexdigest()))


def test_the_locked_copy_is_quiet_and_another_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    manifest = tmp_path / "data" / "manifest.json"
    manifest.write_bytes(b'{"committed": 1}')
    _lock(tmp_path, b'{"committed": 1}')
    assert dvclock.unlocked("data/manifest.json") is None
    manifest.write_bytes(b'{"experiment": 1}')
    line = dvclock.unlocked("data/manifest.json")
    assert line is not None and "\n" not in line
    assert line.endswith("; `dvc checkout` first brings the committed version back")
    assert dvclock.unlocked("data/other.json") is None  # not a locked output


@pytest.mark.parametrize("lock", ["", "stages: [1, 2]\n", "not: [valid\n"])
def test_a_lock_that_records_nothing_usable_is_quiet(tmp_path, monkeypatch, lock):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dvc.lock").write_text(lock)
    (tmp_path / "m.json").write_text("{}")
    assert dvclock.unlocked("m.json") is None


def test_write_grows_from_an_unlocked_manifest_and_says_so(make_raw, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_listing(list_files(str(make_raw(12, 16, classes=2))), "data/listing")
    args = ["write", "data/listing", "--out", "data/shards", "--manifest", "data/manifest.json"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0 and "warning" not in first.stderr
    _lock(tmp_path, Path("data/manifest.json").read_bytes())
    same = CliRunner().invoke(app, args)
    assert same.exit_code == 0 and "warning" not in same.stderr
    (tmp_path / "dvc.lock").write_text(LOCK.format(md5="f" * 32))  # another version committed
    other = CliRunner().invoke(app, args)
    assert other.exit_code == 0, other.output
    assert "warning: data/manifest.json: expected the version dvc.lock records" in other.stderr


def test_a_manifest_the_workspace_lock_records_but_heads_does_not_is_one_line(
    tmp_path, monkeypatch
):
    """Chained experiments: the first left its manifest and lock in the workspace, so the
    workspace lock agrees with the manifest; the lock HEAD records does not."""
    import subprocess

    monkeypatch.chdir(tmp_path)
    env = ["-c", "user.name=t", "-c", "user.email=t@e"]
    subprocess.run(["git", "init", "-q"], check=True)
    (tmp_path / "data").mkdir()
    manifest = tmp_path / "data" / "manifest.json"
    _lock(tmp_path, b'{"committed": 1}')
    subprocess.run(["git", "add", "dvc.lock"], check=True)
    subprocess.run(["git", *env, "commit", "-qm", "lock"], check=True)
    manifest.write_bytes(b'{"experiment": 7}')
    _lock(tmp_path, b'{"experiment": 7}')  # what `dvc exp run -S write.seed=7` leaves
    line = dvclock.unlocked("data/manifest.json")
    assert line is not None and "\n" not in line
    assert line.startswith("data/manifest.json: expected the version HEAD's dvc.lock records")
    # `dvc checkout` alone restores what the workspace lock records: this very manifest
    assert line.endswith(
        "`git checkout dvc.lock && dvc checkout` first brings the committed version back"
    )
    _lock(tmp_path, b'{"committed": 1}')
    manifest.write_bytes(b'{"committed": 1}')
    assert dvclock.unlocked("data/manifest.json") is None


def test_the_diff_hint_asks_for_head_only_when_the_old_version_is_committed(
    make_raw, tmp_path, monkeypatch
):
    """Grown from a manifest no lock records, the old version is in no commit of HEAD's:
    `dvc get --rev HEAD` would not bring it back."""
    import shutil

    monkeypatch.chdir(tmp_path)
    raw = make_raw(12, 16, classes=2)
    args = ["write", "data/listing", "--out", "data/shards", "--manifest", "data/manifest.json",
            "--old-versions", "remove"]  # fmt: skip
    hints = []
    for lock in ("the manifest", "another"):
        write_listing(list_files(str(raw)), "data/listing")
        assert CliRunner().invoke(app, args).exit_code == 0
        recorded = Path("data/manifest.json").read_bytes() if lock == "the manifest" else b"x"
        _lock(tmp_path, recorded)
        first = sorted(raw.rglob("*.jpg"))[0]
        shutil.copyfile(first, first.with_name(f"added-{len(hints)}.jpg"))
        write_listing(list_files(str(raw)), "data/listing")
        grown = CliRunner().invoke(app, args)
        assert grown.exit_code == 0, grown.output
        hints.append(next(line for line in grown.stdout.splitlines() if "dvc get" in line))
    assert "--rev HEAD -o" in hints[0] and "REV a commit" not in hints[0]
    assert "--rev REV -o" in hints[1]
    assert hints[1].endswith(", REV a commit that holds it (an uncommitted one is gone))")
