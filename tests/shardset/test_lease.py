"""A writer's lease: prune never deletes a version a live writer is re-writing."""

from __future__ import annotations

import json
import os
import posixpath
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tfshards import storage
from tfshards.listing.listing import list_files, write_listing
from tfshards.project import prune as prunes
from tfshards.project.prune import PruneConfig, prune
from tfshards.project.sample import write_synthetic
from tfshards.shardset import layout, lease
from tfshards.shardset.layout import MANIFEST_NAME
from tfshards.shardset.manifest import load
from tfshards.validation.validate import ValidateConfig, validate
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

OLD = 1_000_000_000  # an mtime long past: older than any --min-age

# A real writer process that stops (a file says where) until the parent says go, at
# the moment a slow re-write of many shards would be: shards reused, manifest not yet out.
PAUSED_WRITER = """
import os, sys, time
from tfshards.writing import writer
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

listing, out, seed, pause, go = sys.argv[1:]
real = writer._write_metadata

def paused(*args):
    open(pause, "w").close()
    while not os.path.exists(go):
        time.sleep(0.05)
    return real(*args)

writer._write_metadata = paused
config = WriteConfig(out=out, num_shards=3, seed=int(seed), executor="serial")
result = write(config, listing, progress=False)
print(result.manifest.fingerprint, result.reused)
"""


@pytest.fixture
def shards(tmp_path: Path) -> dict[str, str]:
    """Two finished versions (seeds 1 and 2; 2 is current), every file aged."""
    write_synthetic(str(tmp_path / "raw"), 24, 16, workers=1)
    write_listing(list_files(str(tmp_path / "raw")), str(tmp_path / "listing"))
    names = {}
    for seed in (1, 2):
        config = WriteConfig(
            out=str(tmp_path / "shards"),
            num_shards=3,
            seed=seed,
            executor="serial",
            manifest_copy=str(tmp_path / "m.json"),
        )
        names[f"seed{seed}"] = write(
            config, str(tmp_path / "listing"), progress=False
        ).manifest.fingerprint
    for path in [tmp_path / "shards", *(tmp_path / "shards").rglob("*")]:
        os.utime(path, (OLD, OLD))
    return names


def _start_writer(tmp_path: Path, seed: int) -> subprocess.Popen[str]:
    args = [str(tmp_path / "listing"), str(tmp_path / "shards"), str(seed)]
    args += [str(tmp_path / "paused"), str(tmp_path / "go")]
    writer = subprocess.Popen(
        [sys.executable, "-c", PAUSED_WRITER, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (tmp_path / "paused").exists():
        assert writer.poll() is None, writer.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the writer never reached its pause"
        time.sleep(0.05)
    return writer


def _finish(writer: subprocess.Popen[str], tmp_path: Path) -> tuple[int, str, str]:
    (tmp_path / "go").touch()
    out, err = writer.communicate(timeout=120)
    return writer.returncode, out, err


@pytest.mark.slow
def test_prune_keeps_a_version_a_live_writer_is_rewriting(shards, tmp_path):
    old = shards["seed1"]
    writer = _start_writer(tmp_path, seed=1)  # re-writes the old version: reuses its shards
    report = prune(PruneConfig(manifest=str(tmp_path / "m.json"), delete=True))
    state = {v.name: v for v in report.versions}[old]
    assert state.action == "keep"
    assert state.reason == f"a writer (pid {writer.pid} on {lease._host()}) holds a lease on it"
    rc, out, err = _finish(writer, tmp_path)
    assert rc == 0, err[-2000:]
    assert out.split() == [old, "3"]  # every shard reused, none written
    version = tmp_path / "shards" / old
    assert not list((version / layout.WORK_DIR).glob("*.lease"))  # released
    checked = validate(ValidateConfig(manifest=str(version / MANIFEST_NAME)), progress=False)
    assert checked.ok, checked.problems


@pytest.mark.slow
def test_a_shard_deleted_under_a_writer_stops_it_before_the_manifest(shards, tmp_path):
    old = shards["seed1"]
    version = tmp_path / "shards" / old
    manifest = version / MANIFEST_NAME
    manifest.unlink()  # an interrupted re-write: no manifest yet
    writer = _start_writer(tmp_path, seed=1)
    victim = sorted(version.glob("data-*"))[1]
    victim.unlink()  # what a prune on another host, which cannot see the pid, could do
    rc, _, err = _finish(writer, tmp_path)
    assert rc == 1
    line = err.strip().splitlines()[-1]
    assert f"{victim}: expected the shard just written" in line and "found it missing" in line
    assert not manifest.exists()  # never published for a set with a shard missing


def test_a_dead_writers_lease_holds_nothing_and_is_swept(shards, tmp_path):
    version = tmp_path / "shards" / shards["seed1"]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = version / layout.WORK_DIR / f"{lease._host()}-{dead.pid}.1{lease.SUFFIX}"
    stale.write_text("{}")
    os.utime(stale, (OLD, OLD))
    report = prune(PruneConfig(manifest=str(tmp_path / "m.json")))
    assert {v.name: v.action for v in report.versions}[shards["seed1"]] == "delete"
    checked = validate(ValidateConfig(manifest=str(version / MANIFEST_NAME)), progress=False)
    assert checked.ok, checked.problems  # a lease is the writer's bookkeeping, not a stray file
    with lease.hold(*storage.open_url(str(version))):
        assert not stale.exists()


def test_a_remote_writers_lease_is_live_until_its_refreshes_stop(tmp_path):
    now = time.time()
    path = f"v/{layout.WORK_DIR}/other_host-123.456{lease.SUFFIX}"
    fresh = {path: {"mtime": now - lease.REFRESH_S}}
    stale = {path: {"mtime": now - lease.TTL_S - 1}}
    assert lease.live_holders(fresh, now=now) == ["pid 123 on other_host"]
    assert lease.live_holders(stale, now=now) == []


def test_the_lease_is_refreshed_while_held(tmp_path):
    fs, folder = storage.open_url(str(tmp_path / "v"))
    with lease.hold(fs, folder, refresh_s=0.05) as path:
        first = os.stat(path).st_mtime_ns
        os.utime(path, ns=(first - 10**9, first - 10**9))
        time.sleep(0.5)
        assert os.stat(path).st_mtime_ns > first - 10**9
        assert json.loads(Path(path).read_text())["pid"] == os.getpid()
    assert not os.path.exists(path)


def test_prune_leaves_the_shards_when_a_lease_appears_after_its_decision(shards, tmp_path):
    old = tmp_path / "shards" / shards["seed1"]
    fs, path = storage.open_url(str(old))
    decided = prunes.VersionState(shards["seed1"], "delete", "not referenced", 0, 0)
    with lease.hold(fs, path):  # a writer starting between the decision and the delete
        state = prunes._delete(fs, posixpath.dirname(path), shards["seed1"], decided)
        assert state.action == "keep" and "took a lease" in state.reason
        assert sorted(p.name for p in old.glob("data-*")) != []
    # On local disk the version went away under a hidden name and came back whole.
    assert (old / MANIFEST_NAME).exists()
    assert not (tmp_path / "shards" / f".{shards['seed1']}.deleting").exists()


def test_killed_writer_on_this_host_releases_its_version_at_once(shards, tmp_path):
    writer = _start_writer(tmp_path, seed=1)
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    version = tmp_path / "shards" / shards["seed1"]
    assert list((version / layout.WORK_DIR).glob("*.lease"))  # left behind by the kill
    report = prune(PruneConfig(manifest=str(tmp_path / "m.json")))
    assert {v.name: v.action for v in report.versions}[shards["seed1"]] == "delete"
    assert load(str(version / MANIFEST_NAME)).fingerprint == shards["seed1"]
