"""The listing's hash cache: unchanged files are not read again, changed ones always are."""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfshards.cli import list as list_cli
from tfshards.errors import InputError, StaleListingError
from tfshards.listing import cachefile, contenthash, hashcache
from tfshards.listing.hashcache import HashCache
from tfshards.listing.listing import Listing, list_files, write_listing

JPEG_START, JPEG_END = b"\xff\xd8\xff\xda", b"\xff\xd9"  # a whole JPEG to the writer
TREE = {
    "cat/001.jpg": b"cat one",
    "cat/sub/002.jpg": b"cat two",
    "dog/001.jpg": b"dog one",
    "dog/002.jpg": b"dog two",
}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "raw"
    for rel, data in TREE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


@pytest.fixture
def no_racy_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files written by the test itself are remembered at once (default: only after 2 s)."""
    monkeypatch.setattr(hashcache, "RACY_NS", 0)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the local files the listing opens and hashes."""
    seen: list[str] = []
    real = contenthash._hash_local

    def counted(folder: str, names: Sequence[str]) -> list[tuple[int, bytes]]:
        seen.extend(os.path.join(folder, name) for name in names)
        return real(folder, names)

    monkeypatch.setattr(contenthash, "_hash_local", counted)
    return seen


def _listing_bytes(root: Path, out: Path, cache: str | None) -> bytes:
    write_listing(list_files(str(root), hash_cache=cache), str(out))
    return (out / "files.jsonl").read_bytes() + (out / "meta.json").read_bytes()


@pytest.mark.usefixtures("no_racy_window", "loop")
def test_second_list_of_unchanged_tree_reads_no_file_and_writes_same_bytes(
    tree: Path, tmp_path: Path, reads: list[str]
) -> None:
    cache = str(tmp_path / "hashes.sqlite")
    without = _listing_bytes(tree, tmp_path / "plain", None)
    assert len(reads) == 4
    first = _listing_bytes(tree, tmp_path / "first", cache)
    assert len(reads) == 8
    second = _listing_bytes(tree, tmp_path / "second", cache)
    assert len(reads) == 8  # nothing opened
    assert first == second == without


@pytest.mark.usefixtures("no_racy_window")
def test_index_listing_uses_the_cache_too(tree: Path, tmp_path: Path, reads: list[str]) -> None:
    index = tmp_path / "index.csv"
    index.write_text("path,label\ncat/001.jpg,a\ndog/002.jpg,b\ncat/sub/002.jpg,a\n")
    cache = str(tmp_path / "hashes.sqlite")
    first = list_files(str(tree), index=str(index), hash_cache=cache)
    assert len(reads) == 3
    assert list_files(str(tree), index=str(index), hash_cache=cache) == first
    assert len(reads) == 3
    assert first == list_files(str(tree), index=str(index))


@pytest.mark.usefixtures("no_racy_window", "loop")
def test_file_rewritten_at_same_size_with_mtime_restored_is_read_again(
    tree: Path, tmp_path: Path, reads: list[str]
) -> None:
    cache = str(tmp_path / "hashes.sqlite")
    before = list_files(str(tree), hash_cache=cache)
    path = tree / "dog/002.jpg"
    st = path.stat()
    path.write_bytes(b"DOG TWO")  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # ctime moves on regardless
    assert path.stat().st_mtime_ns == st.st_mtime_ns
    del reads[:]
    after = list_files(str(tree), hash_cache=cache)
    assert reads == [str(path)]
    assert after == list_files(str(tree))
    changed = [a.path for a, b in zip(before.entries, after.entries, strict=True) if a != b]
    assert changed == ["dog/002.jpg"]


@pytest.mark.usefixtures("no_racy_window")
def test_file_replaced_by_another_with_same_size_and_mtime_is_read_again(
    tree: Path, tmp_path: Path, reads: list[str]
) -> None:
    cache = str(tmp_path / "hashes.sqlite")
    list_files(str(tree), hash_cache=cache)
    path, new = tree / "cat/001.jpg", tmp_path / "new.jpg"
    new.write_bytes(b"CAT ONE")
    st = path.stat()
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(new, path)  # another inode under the same name
    del reads[:]
    after = list_files(str(tree), hash_cache=cache)
    assert reads == [str(path)]
    assert after == list_files(str(tree))


def test_stats_are_the_same_from_c_and_python_and_name_what_cannot_be_read(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tfshards.format import native

    if native.NATIVE is None:
        pytest.skip("tfshards.format._native is not built")
    folder = str(tree / "cat")
    names = ["001.jpg", "sub", "gone.jpg"]
    from_c = contenthash.stat_local(folder, names)
    monkeypatch.setattr(native, "NATIVE", None)
    assert contenthash.stat_local(folder, names) == from_c
    st = (tree / "cat/001.jpg").stat()
    fields = list(memoryview(from_c).cast("q"))
    assert fields[:5] == [st.st_dev, st.st_ino, 7, st.st_mtime_ns, st.st_ctime_ns]
    assert fields[5:] == [0, 0, -errno.EINVAL, 0, 0, 0, 0, -errno.ENOENT, 0, 0]
    with pytest.raises(InputError, match=r"cat/sub: cannot read while listing: .*a folder"):
        contenthash.check_stats(folder, names, from_c)


def test_file_deleted_after_walk_is_an_error_naming_it(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = contenthash.stat_local

    def vanish(folder: str, names: Sequence[str]) -> bytes:
        for name in names:
            os.unlink(os.path.join(folder, name))
        return real(folder, names)

    monkeypatch.setattr(contenthash, "stat_local", vanish)
    with pytest.raises(InputError) as info:
        list_files(str(tree), hash_cache=str(tmp_path / "hashes.sqlite"))
    assert str(info.value).endswith(
        "001.jpg: cannot read while listing: it was removed while listing (No such file or "
        "directory, ENOENT)"
    )


def test_files_changed_within_the_racy_window_of_listing_are_not_remembered(
    tree: Path, tmp_path: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert hashcache.RACY_NS == 2_000_000_000
    monkeypatch.setattr(hashcache, "RACY_NS", 60_000_000_000)  # however slow this machine is
    cache = str(tmp_path / "hashes.sqlite")
    list_files(str(tree), hash_cache=cache)  # the files were written just now: racy
    list_files(str(tree), hash_cache=cache)
    assert len(reads) == 8


def _many_folders(root: Path, folders: int = 200) -> None:
    """Enough rows for a cache of ~30 pages, so damage can land in its middle."""
    for i in range(folders):
        (root / "cat" / f"d{i:03d}").mkdir()
        for j in range(4):
            (root / "cat" / f"d{i:03d}" / f"{j}.jpg").write_bytes(b"%d-%d" % (i, j))


def _damage_middle_page(cache: Path) -> None:
    size = cache.stat().st_size
    page = size // 4096 // 2
    assert page > 2
    with open(cache, "r+b") as f:
        f.seek(page * 4096)
        f.write(b"\xff" * 4096)


def _damage_page_size(cache: Path) -> None:
    with open(cache, "r+b") as f:  # SQLite then calls the whole file "not a database"
        f.seek(16)
        f.write(b"\x00\x07")


@pytest.mark.usefixtures("no_racy_window")
@pytest.mark.parametrize("damage", [_damage_middle_page, _damage_page_size])
def test_damaged_cache_is_rebuilt_once_and_the_next_list_is_warm(
    tree: Path,
    tmp_path: Path,
    reads: list[str],
    capsys: pytest.CaptureFixture[str],
    damage: Callable[[Path], None],
) -> None:
    _many_folders(tree)
    cache = tmp_path / "hashes.sqlite"
    expected = list_files(str(tree))
    list_files(str(tree), hash_cache=str(cache))
    damage(cache)
    capsys.readouterr()
    del reads[:]
    assert list_files(str(tree), hash_cache=str(cache)) == expected
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"hash cache {cache}: damaged (" in err
    assert len(reads) == len(expected.entries)
    del reads[:]
    assert list_files(str(tree), hash_cache=str(cache)) == expected
    assert reads == []
    assert capsys.readouterr().err == ""
    db = sqlite3.connect(cache)
    assert db.execute("PRAGMA quick_check").fetchone() == ("ok",)
    db.close()
    assert cache.read_bytes()[68:72] == cachefile.APPLICATION_ID.to_bytes(4, "big")


@pytest.mark.usefixtures("no_racy_window")
def test_entry_whose_digest_was_overwritten_on_disk_is_not_used(
    tree: Path, tmp_path: Path, reads: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "hashes.sqlite"
    expected = list_files(str(tree), hash_cache=str(cache))
    db = sqlite3.connect(cache, isolation_level=None)  # SQLite keeps no checksum of a row
    db.execute("UPDATE folders SET sha256 = zeroblob(length(sha256)) WHERE path LIKE '%/dog'")
    db.close()
    del reads[:]
    assert list_files(str(tree), hash_cache=str(cache)) == expected
    assert sorted(os.path.basename(r) for r in reads) == ["001.jpg", "002.jpg"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dog fails its CRC (damaged); reading its files again" in err
    del reads[:]
    assert list_files(str(tree), hash_cache=str(cache)) == expected
    assert reads == []


_LOCKER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
if sys.argv[2] == "exclusive-mode":  # readers are shut out too, WAL or not
    db.execute("PRAGMA locking_mode=EXCLUSIVE")
db.execute("BEGIN EXCLUSIVE")
db.execute("DELETE FROM folders WHERE path = 'none'")
print("locked", flush=True)
time.sleep(120)
"""


@pytest.mark.usefixtures("no_racy_window")
@pytest.mark.parametrize("mode", ["transaction", "exclusive-mode"])
def test_cache_locked_by_another_process_lists_in_seconds_without_it(
    tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    cache = tmp_path / "hashes.sqlite"
    list_files(str(tree), hash_cache=str(cache))
    (tree / "cat/003.jpg").write_bytes(b"new")  # something to remember
    locker = subprocess.Popen(
        [sys.executable, "-c", _LOCKER, str(cache), mode], stdout=subprocess.PIPE
    )
    try:
        assert locker.stdout is not None and locker.stdout.readline() == b"locked\n"
        capsys.readouterr()
        started = time.monotonic()
        listing = list_files(str(tree), hash_cache=str(cache))
        took = time.monotonic() - started
    finally:
        locker.kill()
        locker.wait()
    assert took < 5, f"{took:.1f} s"
    assert listing == list_files(str(tree))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "database is locked" in err


def test_cache_in_an_unwritable_place_lists_anyway_with_a_warning(
    tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    listing = list_files(str(tree), hash_cache=str(blocker / "hashes.sqlite"))
    assert listing == list_files(str(tree))
    assert "cannot open" in capsys.readouterr().err


@pytest.mark.usefixtures("no_racy_window")
def test_process_killed_while_writing_leaves_a_usable_cache(tmp_path: Path) -> None:
    cache = tmp_path / "hashes.sqlite"
    script = textwrap.dedent(
        f"""
        from tfshards.listing import hashcache
        hashcache._FLUSH_ROWS = 5000
        cache = hashcache.HashCache({str(cache)!r}, racy_ns=0)
        print("ready", flush=True)
        i = 0
        while True:
            names = [f"{{i}}-{{j}}.jpg" for j in range(100)]
            cache.store(f"/d/{{i}}", names, bytes(40) * 100, bytes(32) * 100)
            i += 1
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    db = sqlite3.connect(cache)
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    rows = db.execute("SELECT count(*) FROM folders").fetchone()[0]
    db.close()
    assert rows > 0 and rows % 50 == 0  # whole transactions of 5000 files only
    reopened = HashCache(str(cache))
    names = [f"{rows - 1}-{j}.jpg" for j in range(100)]
    assert reopened.lookup(f"/d/{rows - 1}", names, bytes(40) * 100) == ["00" * 32] * 100
    reopened.close()


@pytest.mark.usefixtures("no_racy_window")
def test_two_lists_at_once_share_one_cache(tree: Path, tmp_path: Path) -> None:
    cache = str(tmp_path / "hashes.sqlite")
    for i in range(300):
        (tree / "cat" / f"more{i:03d}.jpg").write_bytes(b"%d" % i)
    script = (
        "import sys; from tfshards.listing import hashcache, listing; "
        "hashcache.RACY_NS = 0; "
        "hashcache._FLUSH_ROWS = 10; root, cache, out = sys.argv[1:]; "
        "listing.write_listing(listing.list_files(root, hash_cache=cache), out)"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tree), cache, str(tmp_path / f"out{i}")],
            stderr=subprocess.PIPE,
        )
        for i in range(2)
    ]
    errors = [p.communicate()[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0] and errors == [b"", b""]
    expected = _listing_bytes(tree, tmp_path / "plain", None)
    for i in range(2):
        out = tmp_path / f"out{i}"
        assert (out / "files.jsonl").read_bytes() + (out / "meta.json").read_bytes() == expected
    assert _listing_bytes(tree, tmp_path / "again", cache) == expected


def test_cli_uses_the_env_cache_and_none_turns_it_off(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import typer

    app = typer.Typer()
    app.command()(list_cli.list_files_command)
    cache = tmp_path / "env.sqlite"
    monkeypatch.setenv(hashcache.ENV, str(cache))
    runner = CliRunner()
    result = runner.invoke(app, [str(tree), "--out", str(tmp_path / "a"), "--hash-cache", "none"])
    assert result.exit_code == 0, result.output
    assert not cache.exists()
    result = runner.invoke(app, [str(tree), "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    assert cache.exists()
    assert (tmp_path / "a/files.jsonl").read_bytes() == (tmp_path / "b/files.jsonl").read_bytes()


def test_default_path_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hashcache.ENV, "none")
    assert hashcache.default_path() is None
    monkeypatch.delenv(hashcache.ENV)
    monkeypatch.setenv("TFSHARDS_CACHE", "/c")
    assert hashcache.default_path() == "/c/listing-hashes.sqlite"
    monkeypatch.delenv("TFSHARDS_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "/x")
    assert hashcache.default_path() == "/x/tfshards/listing-hashes.sqlite"


@pytest.mark.usefixtures("no_racy_window")
@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_entry_poisoned_with_right_stats_fails_write_once_and_the_next_list_is_right(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loop: str, on_error: str
) -> None:
    from tfshards.writing.config import WriteConfig
    from tfshards.writing.writer import write

    root = tmp_path / "raw"
    for rel in ("cat/001.jpg", "dog/001.jpg", "dog/002.jpg"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(JPEG_START + rel.encode() + JPEG_END)
    cache = tmp_path / "hashes.sqlite"
    monkeypatch.setenv(hashcache.ENV, str(cache))  # where write looks, as list does
    good = list_files(str(root), hash_cache=str(cache))
    folder, names = str(root / "dog"), ["001.jpg", "002.jpg"]
    poison = HashCache(str(cache), racy_ns=0)  # the stats the files have, digests they do not
    wrong = hashlib.sha256(b"another image").digest()
    poison.store(folder, names, contenthash.stat_local(folder, names), wrong * 2)
    poison.close()
    poisoned = list_files(str(root), hash_cache=str(cache))
    assert poisoned.entries[1].token == "sha256:" + wrong.hex()

    def write_to(out: str, listing: Listing) -> None:
        config = WriteConfig(out=str(tmp_path / out), executor="serial", on_error=on_error)
        write(config, listing, progress=False)

    with pytest.raises(StaleListingError) as info:
        write_to("out", poisoned)
    name = os.path.basename(str(info.value.path))  # the first the shuffled shards reach
    found = hashlib.sha256(JPEG_START + b"dog/" + name.encode() + JPEG_END).hexdigest()
    assert str(info.value) == (
        f"{root}/dog/{name}: listed sha256 {wrong.hex()} came from the hash cache {cache}, but "
        f"the file, unchanged since (same stat), has sha256 {found}: that entry was wrong and "
        "is dropped; re-run `tfshards list`"
    )
    assert info.value.cache == str(cache)
    assert list_files(str(root), hash_cache=str(cache)) == good
    write_to("again", good)


@pytest.mark.usefixtures("no_racy_window")
def test_file_changed_since_listed_is_still_reported_as_changed(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "hashes.sqlite"
    monkeypatch.setenv(hashcache.ENV, str(cache))
    list_files(str(tree), hash_cache=str(cache))
    path = tree / "dog/001.jpg"
    listed = hashlib.sha256(path.read_bytes()).digest()
    path.write_bytes(b"DOG ONE")  # same size, new ctime: the cache did no wrong
    assert hashcache.stale_listing("dog/001.jpg", str(path), listed, "ff" * 32) is None
    row = sqlite3.connect(cache).execute("SELECT count(*) FROM folders").fetchone()
    assert row == (3,)  # nothing dropped


def test_a_tilde_in_a_cache_path_is_the_home_folder(tmp_path, monkeypatch):
    """``~/x`` from a file no shell expanded (a .env, a service unit) made a folder named ~."""
    from tfshards import cachedir
    from tfshards.listing import hashcache
    from tfshards.reading.cache import ShardCache

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TFSHARDS_CACHE", "~/caches")
    monkeypatch.delenv("TFSHARDS_HASH_CACHE", raising=False)
    assert cachedir.root() == str(tmp_path / "caches")
    assert hashcache.default_path() == str(tmp_path / "caches" / "listing-hashes.sqlite")
    assert ShardCache().directory == str(tmp_path / "caches")
    monkeypatch.setenv("TFSHARDS_HASH_CACHE", "~/h.sqlite")
    assert hashcache.default_path() == str(tmp_path / "h.sqlite")
    assert hashcache.HashCache("~/own.sqlite").path == str(tmp_path / "own.sqlite")
