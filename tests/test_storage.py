"""Local publication: fsync before the rename, the folder after; temps of dead writers go."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tfshards import atomicfile, processes, storage


def _spy_on_disk_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Record fsync (of a file or a folder) and replace calls, passing each through."""
    calls: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append(("fsync", "folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"))
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        calls.append(("replace", os.path.basename(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return calls


def test_a_published_file_is_on_disk_before_its_name_and_the_name_after(tmp_path, monkeypatch):
    """A power loss must never leave the final name pointing at content that was not written."""
    calls = _spy_on_disk_calls(monkeypatch)
    target = tmp_path / "shard.tfrecord"
    assert (
        atomicfile.write_atomic(storage.open_url(str(tmp_path))[0], str(target), [b"ab", b"c"]) == 3
    )
    assert calls == [("fsync", "file"), ("replace", "shard.tfrecord"), ("fsync", "folder")]
    assert target.read_bytes() == b"abc"


def test_new_folders_are_synced_into_their_parents_before_the_file_lands(tmp_path, monkeypatch):
    calls = _spy_on_disk_calls(monkeypatch)
    synced_folders = []
    real_fsync_dir = atomicfile.fsync_dir

    def fsync_dir(directory: str) -> None:
        synced_folders.append(os.path.relpath(directory, tmp_path))
        real_fsync_dir(directory)

    monkeypatch.setattr(atomicfile, "fsync_dir", fsync_dir)
    target = tmp_path / "out" / "v1" / "manifest.json"
    atomicfile.write_atomic(storage.open_url(str(tmp_path))[0], str(target), [b"{}"])
    assert synced_folders == [".", "out", os.path.join("out", "v1")]
    assert calls[-3:] == [("fsync", "file"), ("replace", "manifest.json"), ("fsync", "folder")]
    assert target.read_bytes() == b"{}"


def test_an_aborted_file_is_neither_synced_nor_published(tmp_path, monkeypatch):
    calls = _spy_on_disk_calls(monkeypatch)
    sink = atomicfile.AtomicSink(storage.open_url(str(tmp_path))[0], str(tmp_path / "x"))
    sink.write([b"partial"])
    sink.abort()
    assert calls == [] and list(tmp_path.iterdir()) == []


def test_a_file_that_cannot_take_its_name_is_named_and_leaves_no_temp_file(tmp_path):
    (tmp_path / "taken").mkdir()  # a folder where the file is to go
    fs = storage.open_url(str(tmp_path))[0]
    with pytest.raises(IsADirectoryError) as raised:
        atomicfile.write_atomic(fs, str(tmp_path / "taken"), [b"x"])
    assert raised.value.filename == str(tmp_path / "taken")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    assert not list((tmp_path / "taken").iterdir())


@pytest.mark.parametrize("interrupted", ["os.close", "os.replace"])
def test_a_commit_interrupted_by_ctrl_c_aborts_cleanly(tmp_path, monkeypatch, interrupted):
    """Ctrl-C inside commit, then abort: no second close of the same descriptor, no leftover."""
    sink = atomicfile.AtomicSink(storage.open_url(str(tmp_path))[0], str(tmp_path / "x"))
    sink.write([b"abc"])
    real = getattr(os, interrupted.split(".")[1])

    def then_interrupt(*args):
        real(*args)
        raise KeyboardInterrupt

    monkeypatch.setattr(interrupted, then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        sink.commit()
    monkeypatch.undo()
    sink.abort()
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == (["x"] if interrupted == "os.replace" else []), left


def test_a_zombie_writers_temp_file_is_swept(tmp_path):
    """A killed writer that nobody reaped still answers kill(pid, 0): it is dead all the same."""
    script = (
        "import sys, time\n"
        "from tfshards import atomicfile, storage\n"
        "sink = atomicfile.AtomicSink(storage.open_url(sys.argv[1])[0], sys.argv[1] + '/shard')\n"
        "sink.write([b'half a shard'])\n"
        "print('ready', flush=True)\n"
        "time.sleep(3600)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    writer = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], env=env, stdout=subprocess.PIPE
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline() == b"ready\n"
        writer.kill()  # and no wait(): a zombie until reaped
        while psutil.Process(writer.pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.01)
        (temp,) = tmp_path.iterdir()
        assert atomicfile.is_temp_name(temp.name) and f"-{writer.pid}." in temp.name
        assert atomicfile.remove_stale_temps(storage.open_url(str(tmp_path))[0], str(tmp_path)) == 1
        assert list(tmp_path.iterdir()) == []
    finally:
        writer.kill()
        writer.wait()


def test_a_live_writers_temp_file_is_kept(tmp_path):
    sink = atomicfile.AtomicSink(storage.open_url(str(tmp_path))[0], str(tmp_path / "shard"))
    try:
        assert atomicfile.remove_stale_temps(storage.open_url(str(tmp_path))[0], str(tmp_path)) == 0
        assert len(list(tmp_path.iterdir())) == 1
    finally:
        sink.abort()


def test_a_temp_file_whose_pid_now_names_another_process_is_swept(tmp_path):
    """A restarted container reuses small pids: the new holder of the pid is not the writer."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    try:
        start = processes.process_start(other.pid)
        assert start is not None
        host = socket.gethostname().replace("-", "_") or "host"
        earlier = tmp_path / f".shard.tmp-{host}-{other.pid}.{start - 100}-0123abcd"
        current = tmp_path / f".shard.tmp-{host}-{other.pid}.{start}-4567abcd"
        earlier.write_bytes(b"a dead writer's half shard")
        current.write_bytes(b"a live writer's half shard")
        assert atomicfile.is_temp_name(earlier.name) and atomicfile.is_temp_name(current.name)
        assert atomicfile.remove_stale_temps(storage.open_url(str(tmp_path))[0], str(tmp_path)) == 1
        assert list(tmp_path.iterdir()) == [current]
    finally:
        other.kill()
        other.wait()


def test_inside_resolves_local_links_and_compares_urls_of_one_store(tmp_path):
    (tmp_path / "real" / "v").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert storage.inside(str(tmp_path / "link" / "v" / "x.png"), str(tmp_path / "real" / "v"))
    assert storage.inside(f"file://{tmp_path}/real/v/x", str(tmp_path / "real" / "v"))
    assert not storage.inside(str(tmp_path / "real" / "vx"), str(tmp_path / "real" / "v"))
    assert storage.inside("memory://set/v/x.png", "memory://set/v")
    assert not storage.inside("memory://set/v/x.png", str(tmp_path))
