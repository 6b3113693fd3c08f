"""Data that grows, through real `dvc repro`: two repositories replaying one history give
the same versions byte for byte, and a DVC push of the grown version sends only what is new."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from dvcrepo import run as _run
from tfshards.project.sample import SyntheticSpec, render_synthetic, write_synthetic
from tfshards.shardset.layout import (
    IMAGESTATS_NAME,
    INDEX,
    MANIFEST_NAME,
    RECORDS,
    STATS,
    TFDS_FILES,
)
from tfshards.shardset.manifest import Manifest

pytestmark = pytest.mark.slow
UP_TO_DATE = "Data and pipelines are up to date."
IMAGES = 400  # 25 per split bucket at the default 16 buckets and 16 shards
LABELS = ("cat", "dog", "eel", "fox")  # "aardvark" sorts first: ids must not follow the sort
# The 1% added in step two: two files in old labels, two in the new label "aardvark".
ADDED = ("cat/new-0.jpg", "fox/new-1.jpg", "aardvark/a-0.jpg", "aardvark/a-1.jpg")


def _new_repo(root: Path, env: dict[str, str]) -> None:
    """`git init`, `dvc init`, IMAGES tiny images in LABELS, `tfshards init`, a commit."""
    root.mkdir(parents=True)
    _run(["git", "init", "-q"], root, env)
    _run(["dvc", "init", "-q"], root, env)
    raw = root / "data" / "raw"
    write_synthetic(str(raw), IMAGES, 16, classes=len(LABELS), workers=1)
    for i, label in enumerate(LABELS):
        (raw / f"{i:02d}").rename(raw / label)
    _run(["tfshards", "init", "--image-size", "8"], root, env)
    _commit(root, env, "pipeline")


def _add_files(root: Path) -> None:
    """The same ADDED bytes in every repository: images of another seed."""
    spec = SyntheticSpec(len(ADDED), 16, classes=len(ADDED), seed=7)
    for i, rel in enumerate(ADDED):
        path = root / "data" / "raw" / rel
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(render_synthetic(spec, i))


def _commit(root: Path, env: dict[str, str], message: str) -> None:
    _run(["git", "add", "-A"], root, env)
    _run(["git", "commit", "-qm", message], root, env)


def _step(root: Path, env: dict[str, str], message: str) -> Manifest:
    """`dvc repro validate` (training left out: time), a commit; the version it made."""
    out = _run(["dvc", "repro", "validate"], root, env)
    assert "Running stage 'write'" in out and "Running stage 'validate'" in out
    hint = re.search(r"`(dvc get [^`]+)`, then `(tfshards diff [^`]+)` lists them", out)
    grown = bool(Manifest.from_json((root / "data/manifest.json").read_bytes()).base)
    assert bool(hint) == grown, out
    if hint:  # a grown version, its old one removed: the commands write names work
        assert hint[1].split()[-1].startswith(env["TMPDIR"])  # never inside the repository
        _run(hint[1].split(), root, env)
        assert "aardvark" in _run(hint[2].split(), root, env)
    _commit(root, env, message)
    assert UP_TO_DATE in _run(["dvc", "status", "--with-deps", "validate"], root, env)
    assert not _run(["git", "status", "--porcelain"], root, env).strip()
    return Manifest.from_json((root / "data/manifest.json").read_bytes())


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files(version: Path) -> dict[str, str]:
    """Every file of a version directory, relative to it, and its sha256."""
    return {
        p.relative_to(version).as_posix(): _sha256(p)
        for p in sorted(version.rglob("*"))
        if p.is_file()
    }


class Step(NamedTuple):
    """One version as a repository holds it after its commit."""

    manifest: Manifest
    manifest_bytes: bytes  # data/manifest.json
    files: dict[str, str]  # every file of the version directory -> its sha256
    inodes: dict[str, int]  # each shard's sha256 -> the inode of its file


def _snapshot(root: Path, manifest: Manifest) -> Step:
    """``manifest``'s version as ``root`` holds it now."""
    version = root / manifest.root
    assert sorted(p.name for p in (root / "data/shards").iterdir()) == [version.name]
    inodes = {s.sha256: (version / s.name).stat().st_ino for s in manifest.shards}
    manifest_bytes = (root / "data/manifest.json").read_bytes()
    return Step(manifest, manifest_bytes, _files(version), inodes)


def _history(root: Path, env: dict[str, str]) -> list[Step]:
    """Both steps in ``root``, each as it stands after its commit."""
    _new_repo(root, env)
    seen: list[Step] = []
    for message in ("first version", "1% more, and aardvark"):
        if seen:
            _add_files(root)
        seen.append(_snapshot(root, _step(root, env, message)))
    return seen


def test_two_repositories_replaying_one_history_grow_the_same_versions(replayed):
    a, b = replayed.a, replayed.b
    for mine, theirs in zip(a, b, strict=True):
        assert mine.manifest.fingerprint == theirs.manifest.fingerprint
        assert mine.manifest_bytes == theirs.manifest_bytes  # root included
        assert mine.files == theirs.files  # every shard, companion and metadata file
    v1, v2 = (step.manifest for step in a)
    assert v1.base == "" and v2.base == v1.fingerprint
    assert v1.records == IMAGES and v2.records == IMAGES + len(ADDED)
    assert v2.labels == (*LABELS, "aardvark")  # old ids kept, the new label last
    assert v1.labels == LABELS

    old = {s.sha256 for s in v1.shards}
    reused = old & {s.sha256 for s in v2.shards}
    print(f"v1 {len(v1.shards)} shards, v2 {len(v2.shards)}; reused {len(reused)}")
    assert len(reused) >= 0.9 * len(old)
    new = [s for s in v2.shards if s.sha256 not in old]
    assert sum(s.records for s in new) < 0.1 * v2.records  # what was written again
    for step1, step2 in (a, b):  # hard links: v1's files, though its directory is gone
        assert all(step2.inodes[sha] == step1.inodes[sha] for sha in reused)


# -- DVC remote on S3 -------------------------------------------------------------------------


@contextlib.contextmanager
def _recording(endpoint: str, path: Path) -> Iterator[Path]:
    """Every request moto's server (in this process) answers meanwhile, written to ``path``."""
    from moto.moto_api import recorder

    path.write_text("")
    saved, recorder._location = recorder._location, str(path)
    _moto(endpoint, "start-recording")
    try:
        yield path
    finally:
        _moto(endpoint, "stop-recording")
        recorder._location = saved


def _moto(endpoint: str, action: str) -> None:
    request = urllib.request.Request(f"{endpoint}/moto-api/recorder/{action}", method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()


def _entries(text: str) -> Iterator[dict[str, Any]]:
    """The JSON objects of moto's recording, one after another.

    Its threads each write an entry and then its newline, so two entries can
    meet on one line ("Extra data" to ``json.loads``): decode them in turn.
    """
    decoder, at = json.JSONDecoder(), 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            return
        entry, at = decoder.raw_decode(text, at)
        yield entry


def _uploaded(recording: Path) -> tuple[int, int]:
    """Requests that carried a body (PUT, POST) and their body bytes, from moto's recording."""
    count = total = 0
    for entry in _entries(recording.read_text()):
        if entry["method"] not in ("PUT", "POST") or not entry.get("body"):
            continue
        body = entry["body"]
        size = len(base64.b64decode(body)) if entry["body_encoded"] else len(body.encode())
        count, total = count + 1, total + size
    return count, total


def _objects(client: Any, bucket: str) -> dict[str, int]:
    """Key -> size of every object in ``bucket``."""
    found: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        found.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
    return found


def _dir_object(root: Path) -> int:
    """The size of the data/shards out's .dir object in DVC's cache, as dvc.lock names it."""
    outs = yaml.safe_load((root / "dvc.lock").read_text())["stages"]["write"]["outs"]
    (md5,) = [o["md5"] for o in outs if o["path"] == "data/shards"]
    return (root / ".dvc/cache/files/md5" / md5[:2] / md5[2:]).stat().st_size


def _allowance(root: Path, v1: Step, v2: Manifest) -> dict[str, int]:
    """What a push of ``v2`` may send, in bytes, from the files themselves.

    ``shards``: v2's shards v1 lacked; ``metadata``: the manifest, the TFDS files,
    the image statistics and every shard's companions; ``unseen``: every file of v2 whose bytes v1
    lacked; ``dir``: DVC's listing of the out.
    """
    version = root / v2.root
    old = set(v1.files.values())
    metadata = (
        *(version / name for name in (MANIFEST_NAME, IMAGESTATS_NAME, *TFDS_FILES)),
        *(version / INDEX.folder).iterdir(),
        *(version / RECORDS.folder).iterdir(),
        *(version / STATS.folder).iterdir(),
    )
    return {
        "shards": sum((version / s.name).stat().st_size for s in v2.shards if s.sha256 not in old),
        "metadata": sum(p.stat().st_size for p in metadata),
        "unseen": sum(
            (version / rel).stat().st_size for rel, sha in _files(version).items() if sha not in old
        ),
        "dir": _dir_object(root),
    }


class Pushed(NamedTuple):
    """What the second `dvc push` of repository a sent, and what it was allowed to."""

    requests: int  # uploads with a body
    sent: int  # their body bytes, as moto's server received them
    stored: int  # the bytes the bucket gained
    allowance: dict[str, int]  # from _allowance
    in_sync: str  # `dvc status -c` after pushing the rest


class Replayed(NamedTuple):
    a: list[Step]
    b: list[Step]
    pushed: Pushed


def _s3(endpoint: str, bucket: str) -> tuple[dict[str, str], Any]:
    """DVC's environment for moto's server, and a client of a fresh ``bucket``."""
    import boto3

    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=bucket)
    return env, client


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory, _moto_server: str) -> Replayed:
    """One history (a first version, then 1% more files and a new label) in two repositories
    that share nothing: another path, shard cache and listing hash cache. Repository a has a
    DVC remote on moto's S3 and pushes each version; repository b has none."""
    tmp = tmp_path_factory.mktemp("growth")
    bucket = f"growth-{tmp.name.lower().replace('_', '-')}"
    s3_env, client = _s3(_moto_server, bucket)
    envs = {
        where: {
            "TFSHARDS_CACHE": str(tmp / "caches" / where / "shards"),
            "TFSHARDS_HASH_CACHE": str(tmp / "caches" / where / "hashes.sqlite"),
            "TMPDIR": str(tmp / "tmp" / where),  # where write tells to fetch an old version
        }
        for where in ("a", "elsewhere/b")
    }
    for where in envs:
        (tmp / "tmp" / where).mkdir(parents=True)
    started = time.monotonic()
    env, root = {**s3_env, **envs["a"]}, tmp / "a"
    _new_repo(root, env)  # local shards, as init sets them up
    _run(["dvc", "remote", "add", "-d", "store", f"s3://{bucket}/dvc"], root, env)
    _commit(root, env, "remote")
    v1 = _snapshot(root, _step(root, env, "first version"))
    _run(["dvc", "push", "-q", "write"], root, env)
    before = _objects(client, bucket)
    assert before  # v1 went

    _add_files(root)
    v2 = _step(root, env, "1% more, and aardvark")
    with _recording(_moto_server, tmp / "moto_recording") as recording:
        _run(["dvc", "push", "-q", "write"], root, env)  # the write stage's outs
    requests, sent = _uploaded(recording)
    after = _objects(client, bucket)
    stored = sum(size for key, size in after.items() if key not in before)
    allowance = _allowance(root, v1, v2)
    _run(["dvc", "push", "-q"], root, env)  # the rest: the listing
    pushed = Pushed(requests, sent, stored, allowance, _run(["dvc", "status", "-c"], root, env))
    a = [v1, _snapshot(root, v2)]
    b = _history(tmp / "elsewhere/b", envs["elsewhere/b"])
    print(f"two histories of {IMAGES} images: {time.monotonic() - started:.1f} s")
    return Replayed(a, b, pushed)


def test_pushing_a_grown_version_sends_its_new_shards_and_metadata_only(replayed):
    (v1, v2), pushed = replayed.a, replayed.pushed
    assert v2.manifest.base == v1.manifest.fingerprint
    may = pushed.allowance
    print(
        f"second push {pushed.requests} uploads, {pushed.sent} body bytes, {pushed.stored} B "
        f"stored; allowance {may}; v2 {len(v2.manifest.shards)} shards, "
        f"{sum(s.bytes for s in v2.manifest.shards)} B"
    )
    assert pushed.stored <= pushed.sent  # the recording saw every byte the bucket gained
    assert pushed.sent <= 1.1 * (may["shards"] + may["metadata"] + may["dir"])
    assert pushed.sent <= 1.1 * (may["unseen"] + may["dir"])  # nothing v1 had went twice
    assert "in sync" in pushed.in_sync
