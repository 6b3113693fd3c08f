"""The hash cache's file: only a file marked as ours is written; anything else is refused as is."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tfshards.errors import InputError
from tfshards.listing import cachefile, hashcache
from tfshards.listing.listing import list_files

TREE = {"cat/001.jpg": b"cat one", "dog/001.jpg": b"dog one", "dog/002.jpg": b"dog two"}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "raw"
    for rel, data in TREE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def _digests(folder: Path) -> dict[str, str]:
    """sha256 of every file in ``folder``, by name: what must not change."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _other_apps_db(path: Path, journal: str, app_id: int) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(f"PRAGMA journal_mode={journal}")
    db.execute(f"PRAGMA application_id={app_id}")
    db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    db.execute("INSERT INTO notes (body) VALUES ('keep me')")
    db.execute("PRAGMA user_version=7")
    db.close()


def test_text_file_at_the_cache_path_is_refused_in_one_line_and_left_as_is(
    tree: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "caches" / "notes.txt"
    cache.parent.mkdir()
    cache.write_text("my shopping list\nmilk\n")
    before = _digests(cache.parent)
    with pytest.raises(InputError) as info:
        list_files(str(tree), hash_cache=str(cache))
    assert str(info.value) == (
        f"{cache}: expected a tfshards hash cache (SQLite application_id 0x74667368), found a "
        "text file; left as it is: remove it or choose another --hash-cache"
    )
    assert info.value.path == str(cache)
    assert _digests(cache.parent) == before  # no -wal, -shm or temporary left either


@pytest.mark.parametrize(("journal", "app_id"), [("delete", 0), ("wal", 0x1234)])
def test_other_applications_database_is_refused_and_not_switched_to_wal(
    tree: Path, tmp_path: Path, journal: str, app_id: int
) -> None:
    folder = tmp_path / "apps"
    folder.mkdir()
    cache = folder / "notes.sqlite"
    _other_apps_db(cache, journal, app_id)
    before = _digests(folder)
    with pytest.raises(InputError, match=r"notes.sqlite: expected a tfshards hash cache") as info:
        list_files(str(tree), hash_cache=str(cache))
    assert f"another application's SQLite database (application_id {app_id}, tables: notes)" in (
        str(info.value)
    )
    assert _digests(folder) == before
    db = sqlite3.connect(cache)
    assert db.execute("PRAGMA user_version").fetchone() == (7,)
    assert db.execute("SELECT body FROM notes").fetchall() == [("keep me",)]
    db.close()


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_side_file_beside_a_missing_cache_is_refused_and_no_cache_is_made(
    tree: Path, tmp_path: Path, suffix: str
) -> None:
    folder = tmp_path / "caches"
    folder.mkdir()
    cache = folder / "hashes.sqlite"
    stray = folder / f"hashes.sqlite{suffix}"
    stray.write_bytes(b"another program's log\n" * 50)
    before = _digests(folder)
    with pytest.raises(InputError) as info:
        list_files(str(tree), hash_cache=str(cache))
    assert str(info.value).startswith(f"{stray}: expected no file there or SQLite's side file")
    assert f"found a file beside a missing hash cache {cache}" in str(info.value)
    assert _digests(folder) == before and not cache.exists()


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_foreign_side_file_beside_our_cache_is_refused_and_both_are_left_as_they_are(
    tree: Path, tmp_path: Path, suffix: str
) -> None:
    folder = tmp_path / "caches"
    folder.mkdir()
    cache = folder / "hashes.sqlite"
    list_files(str(tree), hash_cache=str(cache))
    (folder / f"hashes.sqlite{suffix}").write_text("not SQLite's\n")
    before = _digests(folder)
    with pytest.raises(InputError, match=rf"hashes.sqlite{suffix}: expected no file there"):
        list_files(str(tree), hash_cache=str(cache))
    assert _digests(folder) == before


def test_cli_refuses_a_foreign_cache_in_one_line_with_exit_1(tree: Path, tmp_path: Path) -> None:
    cache = tmp_path / "other.sqlite"
    _other_apps_db(cache, "delete", 0)
    before = cache.read_bytes()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = str(tmp_path / "out")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfshards",
            "list",
            str(tree),
            "--out",
            out,
            "--hash-cache",
            str(cache),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert f"{cache}: expected a tfshards hash cache" in proc.stderr
    assert cache.read_bytes() == before


def test_new_cache_carries_the_mark_and_leaves_no_temporary(tree: Path, tmp_path: Path) -> None:
    cache = tmp_path / "new" / "hashes.sqlite"
    list_files(str(tree), hash_cache=str(cache))
    assert sorted(p.name for p in cache.parent.iterdir()) == ["hashes.sqlite"]
    assert cache.read_bytes()[68:72] == cachefile.APPLICATION_ID.to_bytes(4, "big")
    db = sqlite3.connect(cache)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert db.execute("PRAGMA user_version").fetchone() == (cachefile.SCHEMA,)
    db.close()


def test_unmarked_cache_of_an_older_tfshards_is_recognised_and_rebuilt(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(hashcache, "RACY_NS", 0)
    cache = tmp_path / "hashes.sqlite"
    db = sqlite3.connect(cache, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(  # exactly what tfshards wrote before caches were marked
        "CREATE TABLE IF NOT EXISTS folders (\n    path TEXT PRIMARY KEY, names TEXT NOT NULL, "
        "stats BLOB NOT NULL, sha256 BLOB NOT NULL\n) WITHOUT ROWID"
    )
    db.execute("PRAGMA user_version=1")
    db.close()
    expected = list_files(str(tree))
    assert list_files(str(tree), hash_cache=str(cache)) == expected
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "schema 1, expected 2); rebuilding it" in err
    assert cache.read_bytes()[68:72] == cachefile.APPLICATION_ID.to_bytes(4, "big")
    assert list_files(str(tree), hash_cache=str(cache)) == expected
    assert capsys.readouterr().err == ""


def test_cache_created_by_another_list_at_the_same_moment_is_kept(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "hashes.sqlite"
    real = cachefile._build

    def other_list_wins(folder: str) -> str:
        temp = real(folder)
        if not cache.exists():  # the other list links its own first
            other = real(folder)
            os.link(other, cache)
            os.unlink(other)
        return temp

    monkeypatch.setattr(cachefile, "_build", other_list_wins)
    list_files(str(tree), hash_cache=str(cache))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hashes.sqlite", "raw"]
