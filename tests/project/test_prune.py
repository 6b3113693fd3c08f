"""Prune: unreferenced version directories are listed, and deleted only when asked."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tfshards.cli import app
from tfshards.errors import ConfigError, InputError
from tfshards.listing.listing import Listing, list_files
from tfshards.project.prune import PruneConfig, _freed, prune
from tfshards.shardset.layout import MANIFEST_NAME
from tfshards.shardset.manifest import Manifest

OLD = 1_000_000_000  # an mtime long past: older than any --min-age


@pytest.fixture
def listing(make_raw: Callable[..., Path]) -> Listing:
    return list_files(str(make_raw(24, 16)))


@pytest.fixture
def write_options() -> dict[str, object]:
    return {"num_shards": 2, "executor": "serial"}


def _age(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        os.utime(path, (OLD, OLD))


@pytest.fixture
def versions(
    write_set: Callable[..., Manifest], listing: Listing, tmp_path: Path
) -> dict[str, str]:
    """Four finished versions (seeds 1-4; seed 4 is current) and an interrupted one."""
    out = tmp_path / "shards"
    names, copy = {}, str(tmp_path / "m.json")
    for seed in (1, 2, 3, 4):
        names[f"seed{seed}"] = write_set(listing, out, seed=seed, manifest_copy=copy).fingerprint
    interrupted = out / "00000000deadbeef"
    interrupted.mkdir()
    (interrupted / "x-00000-of-00001.tfrecord").write_bytes(b"partial")
    (out / "notes").mkdir()  # not a version: never touched
    for child in out.iterdir():
        _age(child)
    return names


def _actions(report: Any) -> dict[str, str]:
    return {v.name: v.action for v in report.versions}


def test_dry_run_lists_unreferenced_versions_and_deletes_nothing(versions, tmp_path):
    before = sorted(p.name for p in (tmp_path / "shards").iterdir())
    report = prune(PruneConfig(manifest=str(tmp_path / "m.json")))
    assert _actions(report) == {
        versions["seed1"]: "delete",
        versions["seed2"]: "delete",
        versions["seed3"]: "delete",
        versions["seed4"]: "keep",
        "00000000deadbeef": "keep",
    }
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == before
    assert "would delete 3" in report.summary() and "--delete" in report.summary()


def test_delete_removes_exactly_the_unreferenced_finished_versions(versions, tmp_path):
    report = prune(PruneConfig(manifest=str(tmp_path / "m.json"), delete=True))
    left = sorted(p.name for p in (tmp_path / "shards").iterdir())
    assert left == sorted(["00000000deadbeef", "notes", versions["seed4"]])
    assert sum(v.action == "deleted" for v in report.versions) == 3
    assert Manifest.from_json((tmp_path / "m.json").read_bytes()).fingerprint == versions["seed4"]


def test_recent_and_temp_holding_versions_are_never_touched(versions, tmp_path):
    out = tmp_path / "shards"
    os.utime(out / versions["seed1"] / MANIFEST_NAME)  # touched just now
    live = out / versions["seed2"] / "_work" / ".x.tfrecord.tmp-host-1-abcdef12"
    live.write_bytes(b"")
    os.utime(live, (OLD, OLD))
    report = prune(PruneConfig(manifest=str(tmp_path / "m.json"), delete=True))
    states = {v.name: v for v in report.versions}
    assert states[versions["seed1"]].reason.startswith("modified recently")
    assert states[versions["seed2"]].reason.startswith("holds a temp file")
    assert states["00000000deadbeef"].reason.startswith("no manifest.json")
    assert (out / versions["seed1"]).is_dir() and (out / versions["seed2"]).is_dir()
    assert not (out / versions["seed3"]).exists()


def test_a_version_holding_a_file_tfshards_did_not_write_is_kept_with_its_name(versions, tmp_path):
    out = tmp_path / "shards"
    mine = out / versions["seed1"] / "user-notes.txt"
    mine.write_text("mine")
    (out / versions["seed2"] / "eval").mkdir()
    (out / versions["seed2"] / "eval" / "scores.csv").write_text("1")
    for child in out.iterdir():
        _age(child)
    report = prune(PruneConfig(manifest=str(tmp_path / "m.json"), delete=True))
    states = {v.name: v for v in report.versions}
    assert states[versions["seed1"]].action == "keep"
    assert states[versions["seed1"]].reason == (
        "holds a file tfshards did not write (user-notes.txt), so it stays"
    )
    assert states[versions["seed2"]].reason.startswith(
        "holds a file tfshards did not write (eval/scores.csv)"
    )
    assert mine.read_text() == "mine" and (out / versions["seed2"] / "eval").is_dir()
    assert states[versions["seed3"]].action == "deleted"


def test_a_manifest_from_another_location_is_refused(write_set, versions, listing, tmp_path):
    write_set(listing, tmp_path / "elsewhere", seed=9, manifest_copy=str(tmp_path / "other.json"))
    with pytest.raises(ConfigError, match="expected the current version"):
        prune(PruneConfig(manifest=str(tmp_path / "other.json"), out=str(tmp_path / "shards")))
    assert len(list((tmp_path / "shards").iterdir())) == 6


def test_an_out_that_is_a_file_is_refused_as_one(versions, tmp_path):
    """It listed the file itself and said "found 0 other versions"."""
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    with pytest.raises(ConfigError) as refused:
        prune(PruneConfig(manifest=str(tmp_path / "m.json"), out=str(notes), delete=True))
    assert str(refused.value) == (
        f"{notes}: expected the folder of the shard versions (--out), found a file"
    )
    assert notes.read_text() == "mine"


def _git(cwd: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "DVC_NO_ANALYTICS": "1"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e"}
    subprocess.run(args, cwd=cwd, env=env, check=True, capture_output=True, timeout=120)


@pytest.mark.slow
def test_keep_commits_keeps_the_versions_of_the_last_n_manifests(write_set, listing, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "git", "init", "-q")
    manifest = repo / "manifest.json"
    names, copy = [], str(manifest)
    for seed in (1, 2, 3, 4):
        names.append(write_set(listing, repo / "shards", seed=seed, manifest_copy=copy).fingerprint)
        _git(repo, "git", "add", "manifest.json")
        _git(repo, "git", "commit", "-qm", f"seed {seed}")
    for child in (repo / "shards").iterdir():
        _age(child)
    report = prune(PruneConfig(manifest=str(manifest), keep_commits=2, delete=True))
    assert _actions(report) == {
        names[0]: "deleted",
        names[1]: "deleted",
        names[2]: "keep",
        names[3]: "keep",
    }
    assert {v.reason for v in report.versions if v.action == "keep"} == {
        "referenced by the current manifest",
        f"referenced by the manifest at commit {_head(repo, 1)[:10]}",
    }


@pytest.mark.slow
def test_a_committed_manifest_missing_from_the_cache_stops_prune_not_deletes_its_version(
    write_set, listing, tmp_path
):
    """DVC says PathMissingError both when a commit never had the manifest and when the
    cache and remote lack it: only the first has no version to keep."""
    repo = tmp_path / "repo"
    repo.mkdir()
    dvc = os.path.join(os.path.dirname(sys.executable), "dvc")
    _git(repo, "git", "init", "-q")
    _git(repo, dvc, "init", "-q")
    manifest = repo / "manifest.json"
    for seed in (1, 2):
        write_set(listing, repo / "shards", seed=seed, manifest_copy=str(manifest))
        _git(repo, dvc, "add", "-q", "manifest.json")
        _git(repo, "git", "add", "manifest.json.dvc", ".gitignore")
        _git(repo, "git", "commit", "-qm", f"seed {seed}")
    for child in (repo / "shards").iterdir():
        _age(child)
    shutil.rmtree(repo / ".dvc" / "cache")  # a clone that pulled HEAD's manifest only
    _git(repo, dvc, "remote", "add", "-d", "gone", str(tmp_path / "no-remote"))
    config = PruneConfig(manifest=str(manifest), keep_commits=2, delete=True)
    with pytest.raises(InputError, match=r"^manifest\.json at commit [0-9a-f]{10}: cannot read"):
        prune(config)
    assert len(list((repo / "shards").iterdir())) == 2


@pytest.mark.slow
def test_branches_experiments_and_a_project_in_a_subfolder_keep_their_versions(
    write_set, listing, tmp_path
):
    """A DVC project in a folder of the repository (its dvc.lock is sub/dvc.lock to git):
    --keep-commits keeps HEAD's last versions; a branch's and an experiment's (a commit
    under refs/exps/, as `dvc exp run` leaves) are kept by default, listed with
    --no-keep-refs; a version nothing references goes."""
    repo, dvc = tmp_path / "repo", os.path.join(os.path.dirname(sys.executable), "dvc")
    sub = repo / "sub"
    sub.mkdir(parents=True)
    _git(repo, "git", "init", "-q", "-b", "main")
    _git(sub, dvc, "init", "-q", "--subdir")
    (sub / ".gitignore").write_text("/shards\n/src.json\n")
    _git(sub, dvc, "stage", "add", "-q", "-n", "copy", "-d", "src.json", "-o", "manifest.json",
         "cp src.json manifest.json")  # fmt: skip
    names = {}

    def version(seed: int, message: str) -> None:
        m = write_set(listing, sub / "shards", seed=seed, manifest_copy=str(sub / "src.json"))
        names[seed] = m.fingerprint
        _git(sub, dvc, "repro", "-q")
        _git(repo, "git", "add", "-A", "sub")
        _git(repo, "git", "commit", "-qm", message)

    version(1, "v1")
    version(2, "v2")
    _git(repo, "git", "checkout", "-q", "-b", "side")
    version(3, "a branch")
    version(4, "an experiment")
    _git(repo, "git", "update-ref", f"refs/exps/ab/{'c' * 38}/s4", "HEAD")
    _git(repo, "git", "update-ref", "refs/exps/exec/EXEC_HEAD", "HEAD")  # DVC's bookkeeping
    version(6, "tagged")
    _git(repo, "git", "tag", "-a", "t6", "-m", "a release")  # annotated: a tag object
    version(7, "a teammate's")
    _git(repo, "git", "update-ref", "refs/remotes/origin/team", "HEAD")  # as a fetch leaves it
    _git(repo, "git", "reset", "-q", "--hard", "HEAD~3")
    _git(repo, "git", "checkout", "-q", "main")
    _git(sub, dvc, "checkout", "-q")
    names[5] = write_set(listing, sub / "shards", seed=5).fingerprint  # referenced by none
    for child in (sub / "shards").iterdir():
        _age(child)
    manifest = str(sub / "manifest.json")
    listed = prune(PruneConfig(manifest=manifest, keep_commits=2, keep_refs=False))
    assert {n for n, a in _actions(listed).items() if a == "keep"} == {names[1], names[2]}
    report = prune(PruneConfig(manifest=manifest, keep_commits=2, delete=True))
    assert {n for n, a in _actions(report).items() if a != "keep"} == {names[5]}
    reasons = {
        v.name: v.reason.removeprefix("referenced by the manifest ") for v in report.versions
    }
    assert [reasons[names[k]] for k in (3, 4, 6, 7)] == [
        "of branch side", "of experiment s4", "of tag t6", "of remote branch origin/team"
    ]  # fmt: skip
    # A clone holding only the current version's data: the tips that record the
    # workspace's manifest are not read, the others stop prune in one line.
    shutil.rmtree(sub / ".dvc" / "cache")
    with pytest.raises(InputError, match=r"at experiment s4 \(\w{10}\): cannot read .*remove s4`$"):
        prune(PruneConfig(manifest=manifest))
    _git(repo, "git", "branch", "-D", "side")
    for ref in (f"refs/exps/ab/{'c' * 38}/s4", "refs/tags/t6", "refs/remotes/origin/team"):
        _git(repo, "git", "update-ref", "-d", ref)
    assert _actions(prune(PruneConfig(manifest=manifest)))[names[2]] == "keep"


@pytest.mark.slow
def test_refs_keep_their_versions_when_the_manifest_is_renamed_or_given_as_a_copy(
    write_set, listing, tmp_path
):
    """Refs were read at the path prune was given: a tag from before the manifest's rename,
    or any ref when --manifest named a copy, kept nothing, and --delete lost its version.
    A commit's pipeline names its manifest (``--manifest PATH``, an out of the stage)."""
    repo, dvc = tmp_path / "repo", os.path.join(os.path.dirname(sys.executable), "dvc")
    repo.mkdir()
    _git(repo, "git", "init", "-q", "-b", "main")
    _git(repo, dvc, "init", "-q")
    (repo / ".gitignore").write_text("/shards\n/src.json\n/copy.json\n")
    names = {}

    def version(seed: int, out: str, named: str = "") -> None:
        m = write_set(listing, repo / "shards", seed=seed, manifest_copy=str(repo / "src.json"))
        names[seed] = m.fingerprint
        option = f"--manifest {named}" if named else "tfshards write"  # or its default
        (repo / "dvc.yaml").write_text(
            f"stages:\n  write:\n    cmd: mkdir -p data && cp src.json {out} && echo {option}\n"
            f"    deps: [src.json]\n    outs: [{out}]\n"
        )
        _git(repo, dvc, "repro", "-q")
        _git(repo, "git", "add", "-A")
        _git(repo, "git", "commit", "-qm", f"seed {seed}")

    version(3, "data/manifest.json")  # tfshards write's default --manifest
    _git(repo, "git", "tag", "v0")
    version(1, "manifest.json", "./manifest.json")  # spelled otherwise than the out
    _git(repo, "git", "tag", "v1")
    version(2, "renamed.json", "renamed.json")
    (repo / "copy.json").write_bytes((repo / "renamed.json").read_bytes())
    for child in (repo / "shards").iterdir():
        _age(child)
    for given in ("renamed.json", "copy.json"):
        report = prune(PruneConfig(manifest=str(repo / given)))
        assert _actions(report) == {names[k]: "keep" for k in (1, 2, 3)}, given
        reasons = {v.name: v.reason for v in report.versions}
        assert reasons[names[1]] == "referenced by the manifest of tag v1"
        assert reasons[names[3]] == "referenced by the manifest of tag v0"


@pytest.mark.slow
def test_detached_head_tags_of_anything_and_a_linked_manifest_keep_what_they_name(
    write_set, listing, tmp_path, monkeypatch
):
    """HEAD detached at a commit of its own, a tag of a file and a tag of a tag, and the
    manifest a link (DVC's cache.type symlink): each used to lose a version or crash."""
    from tfshards.project import committed

    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "git", "init", "-q", "-b", "main")
    manifest, names = repo / "manifest.json", {}
    for seed in (1, 2, 3):
        names[seed] = write_set(listing, repo / "shards", seed=seed, manifest_copy=str(manifest))
        if seed == 3:
            break  # seed 3: the workspace's, never committed
        _git(repo, "git", "add", "manifest.json")
        _git(repo, "git", "commit", "-qm", f"seed {seed}")
        if seed == 1:
            _git(repo, "git", "tag", "-a", "inner", "-m", "one")
            _git(repo, "git", "tag", "-a", "outer", "-m", "a tag of a tag", "inner")
            _git(repo, "git", "checkout", "-q", "--detach")
    blob = subprocess.run(["git", "hash-object", "-w", "manifest.json"], cwd=repo,
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    _git(repo, "git", "tag", "a-file", blob)
    (repo / "store").mkdir()
    manifest.rename(repo / "store" / "m")
    manifest.symlink_to(repo / "store" / "m")
    for child in (repo / "shards").iterdir():
        _age(child)
    report = prune(PruneConfig(manifest=str(manifest)))
    reasons = {v.name: v.reason for v in report.versions}
    assert reasons == {
        names[1].fingerprint: "referenced by the manifest of branch main",
        names[2].fingerprint: "referenced by the manifest of HEAD",
        names[3].fingerprint: "referenced by the current manifest",
    }
    _git(repo, "git", "checkout", "-q", "--orphan", "fresh")  # an unborn branch beside others
    assert committed.history(str(manifest), 2) == []
    monkeypatch.chdir(repo)
    with pytest.raises(InputError, match=r"^s3://b/m\.json: expected the manifest's path"):
        committed.at_refs("s3://b/m.json")
    with pytest.raises(InputError, match=r"^memory://gone/m\.json: expected the manifest's"):
        prune(PruneConfig(manifest="memory://gone/m.json"))  # refused before it is read


def test_keep_commits_in_a_repository_without_commits_keeps_nothing_more(versions, tmp_path):
    _git(tmp_path, "git", "init", "-q")
    report = prune(PruneConfig(manifest=str(tmp_path / "m.json"), keep_commits=3))
    assert sum(v.action == "keep" for v in report.versions) == 2  # current and interrupted


def test_keep_commits_outside_git_is_one_line_naming_the_option(versions, tmp_path):
    with pytest.raises(InputError, match=r"^--keep-commits 3 reads the manifest's git history"):
        prune(PruneConfig(manifest=str(tmp_path / "m.json"), keep_commits=3))


def _head(repo: Path, back: int) -> str:
    return subprocess.run(
        ["git", "rev-parse", f"HEAD~{back}"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_cli_prints_one_line_per_version_and_a_summary(versions, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no dvc.lock here: not a DVC project
    result = CliRunner().invoke(app, ["prune", "--manifest", str(tmp_path / "m.json")])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 6
    unreferenced = [tmp_path / "shards" / versions[f"seed{i}"] for i in (1, 2, 3)]
    size = sum(p.stat().st_size for v in unreferenced for p in v.rglob("*") if p.is_file())
    assert lines[-1] == (
        f"{tmp_path / 'shards'}: 5 versions, 2 kept, would delete 3 ({size / 1e6:.1f} MB); "
        "run with --delete to delete them"
    )
    assert sum(line.startswith("would delete") for line in lines) == 3
    deleted = CliRunner().invoke(app, ["prune", "--manifest", str(tmp_path / "m.json"), "--delete"])
    assert deleted.exit_code == 0 and deleted.output.count("deleted ") >= 3
    assert "dvc commit" not in deleted.output  # no DVC project here
    missing = CliRunner().invoke(app, ["prune", "--manifest", str(tmp_path / "nope.json")])
    assert missing.exit_code == 1 and missing.output.count("\n") == 1
    assert "nope.json: manifest not found" in missing.output


@pytest.mark.slow
def test_prune_on_s3_deletes_exactly_the_unreferenced_versions(
    write_set, listing, tmp_path, endpoint
):
    import s3fs

    options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
    fs.mkdir("prune-bucket")
    try:
        names = [
            write_set(
                listing,
                "s3://prune-bucket/shards",
                seed=seed,
                manifest_copy=str(tmp_path / "m.json"),
                out_options=options,
            ).fingerprint
            for seed in (1, 2, 3)
        ]
        fs.pipe_file("prune-bucket/shards/00000000deadbeef/x.tfrecord", b"partial")
        fs.pipe_file(f"prune-bucket/shards/{names[1]}/user-eval.txt", b"mine")
        config = PruneConfig(
            manifest=str(tmp_path / "m.json"), min_age_s=0, storage_options=options
        )
        assert _actions(prune(config)) == {
            names[0]: "delete",
            names[1]: "keep",  # it holds a file of the user's
            names[2]: "keep",
            "00000000deadbeef": "keep",
        }
        prune(PruneConfig(**{**config.__dict__, "delete": True}))
        fs.invalidate_cache()
        left = sorted(p.rsplit("/", 1)[-1] for p in fs.ls("prune-bucket/shards"))
        assert left == sorted(["00000000deadbeef", names[1], names[2]])
        assert fs.cat_file(f"prune-bucket/shards/{names[1]}/user-eval.txt") == b"mine"
        assert fs.exists(f"prune-bucket/shards/{names[2]}/{MANIFEST_NAME}")
    finally:
        fs.rm("prune-bucket", recursive=True)
        s3fs.S3FileSystem.clear_instance_cache()


def test_the_summary_counts_hard_linked_shards_as_staying(make_raw, write_set, tmp_path):
    """Grown versions share their kept shards as hard links: deleting the two oldest frees
    each file no kept version links, once; the summary says it, and the disk agrees."""
    raw = make_raw(60, 16)
    out, copy = tmp_path / "shards", str(tmp_path / "m.json")
    chain = []
    for step in range(3):
        if step:
            src = next(raw.rglob("*.jpg"))
            (src.parent / f"extra{step}.jpg").write_bytes(src.read_bytes() + bytes([step]))
        chain.append(write_set(list_files(str(raw)), out, num_shards=4, manifest_copy=copy))
    assert chain[2].base == chain[1].fingerprint and chain[1].base == chain[0].fingerprint
    gone = [out / m.fingerprint for m in chain[:2]]
    for folder in gone:
        _age(folder)
    files = [p for folder in gone for p in folder.rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    used = _disk_bytes(out)
    report = prune(PruneConfig(manifest=copy))
    summary = report.summary()
    planned = _freed([v for v in report.versions if v.action == "delete"])
    prune(PruneConfig(manifest=copy, delete=True))
    freed = used - _disk_bytes(out)
    assert 0 < freed == planned < total  # in bytes, not only as printed
    assert summary == (
        f"{out}: 3 versions, 1 kept, would delete 2 ({freed / 1e6:.1f} MB freed; their files "
        f"hold {total / 1e6:.1f} MB counting each hard link, shared among them or with versions "
        "kept); run with --delete to delete them"
    )


def _disk_bytes(folder: Path) -> int:
    """The bytes of the files under ``folder``, each inode once (as `du` counts them)."""
    inodes = {p.stat().st_ino: p.stat().st_size for p in folder.rglob("*") if p.is_file()}
    return sum(inodes.values())


def test_a_delete_in_a_dvc_project_says_to_commit(versions, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    args = ["prune", "--manifest", str(tmp_path / "m.json"), "--delete"]
    deleted = CliRunner().invoke(app, args)
    assert deleted.exit_code == 0, deleted.output
    last = deleted.output.strip().splitlines()[-1]
    assert last == "next: `dvc commit -f` records the smaller shard folder in dvc.lock"


@pytest.mark.parametrize("age", [-1.0, float("nan")])
def test_a_negative_or_nan_minimum_age_is_refused(age):
    with pytest.raises(ConfigError, match="min_age_s must be >= 0"):
        PruneConfig(manifest="m.json", min_age_s=age)


@pytest.mark.parametrize("age", ["-1", "nan"])
def test_the_command_names_its_own_option_for_a_bad_minimum_age(age):
    """Not the library's min_age_s in seconds: what the user typed, and where."""
    result = CliRunner().invoke(app, ["prune", "--manifest", "m.json", "--min-age-minutes", age])
    assert result.exit_code == 2
    assert "Invalid value for '--min-age-minutes': expected minutes >= 0" in result.output
    assert "min_age_s" not in result.output


def test_a_delete_killed_after_the_manifest_went_is_finished_by_the_next_prune(versions, tmp_path):
    """A kill between deleting the manifest and the rest left a folder every later prune
    kept as "being written"; the marker prune writes first says it was a delete."""
    out = tmp_path / "shards"
    gone = out / versions["seed1"]
    (gone / "_work").mkdir(exist_ok=True)
    (gone / "_work" / "deleting").write_bytes(b"prune\n")  # as _delete leaves it, killed
    (gone / MANIFEST_NAME).unlink()
    _age(gone)
    listed = {v.name: v for v in prune(PruneConfig(manifest=str(tmp_path / "m.json"))).versions}
    assert (listed[versions["seed1"]].action, listed[versions["seed1"]].reason) == (
        "delete",
        "an interrupted delete",
    )
    assert listed["00000000deadbeef"].action == "keep"  # no marker: a write, not a delete
    prune(PruneConfig(manifest=str(tmp_path / "m.json"), delete=True))
    assert not gone.exists() and (out / "00000000deadbeef").is_dir()


# A prune that stops after it renamed a version away, until the test says go: the moment a
# kill or a second prune meets it.
BLOCKED_AFTER_RENAME = """
import os, sys, time
from tfshards.project import prune as p

real = p.lease.live_holders


def held(files, **kw):
    if any(".deleting/" in str(f) for f in files):
        open(os.path.join(sys.argv[2], "renamed"), "w").close()
        while not os.path.exists(os.path.join(sys.argv[2], "go")):
            time.sleep(0.01)
    return real(files, **kw)


p.lease.live_holders = held
print(p.prune(p.PruneConfig(manifest=sys.argv[1], delete=True, min_age_s=0)).summary())
"""


def _blocked_prune(tmp_path: Path) -> subprocess.Popen[str]:
    flags = tmp_path / "flags"
    flags.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", BLOCKED_AFTER_RENAME, str(tmp_path / "m.json"), str(flags)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (flags / "renamed").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return proc


def test_a_prune_killed_mid_delete_leaves_no_half_version_and_the_next_finishes_it(
    versions, tmp_path
):
    """The version's folder goes under a hidden name in one step: a kill never leaves a
    half-deleted folder under the version's own name (one that looks like a write)."""
    out, first = tmp_path / "shards", versions["seed1"]
    proc = _blocked_prune(tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / first).exists() and (out / f".{first}.deleting").is_dir()
    listed = {v.name: v for v in prune(PruneConfig(manifest=str(tmp_path / "m.json"))).versions}
    trash = listed[f".{first}.deleting"]  # named as it is on disk
    assert (trash.action, trash.reason) == ("delete", "an interrupted delete")
    prune(PruneConfig(manifest=str(tmp_path / "m.json"), delete=True))
    left = sorted(p.name for p in out.iterdir())
    assert left == sorted(["00000000deadbeef", "notes", versions["seed4"]])


def test_a_hidden_deleting_folder_the_user_made_is_kept(versions, tmp_path):
    """Only what tfshards wrote goes: a folder named like prune's leftover, holding a file
    of the user's, stays with a reason."""
    mine = tmp_path / "shards" / ".0123456789abcdef.deleting"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    report = prune(PruneConfig(manifest=str(tmp_path / "m.json"), delete=True))
    kept = {v.name: v for v in report.versions}[mine.name]
    assert kept.action == "keep"
    assert kept.reason == "holds a file tfshards did not write (notes.txt), so it stays"
    assert (mine / "notes.txt").read_text() == "my notes"


def test_a_local_trash_folder_without_its_manifest_is_finished_by_the_next_prune(
    versions, tmp_path
):
    """Files go in directory order, the manifest among them: a trash folder without it
    (and without some shards) was kept by every later prune, its space never freed."""
    out, first = tmp_path / "shards", versions["seed1"]
    trash = out / f".{first}.deleting"
    (out / first).rename(trash)  # as the delete leaves it, then killed mid-way
    (trash / "manifest.json").unlink()
    for shard in sorted(trash.glob("*.tfrecord"))[::2]:
        shard.unlink()
    (trash / "index" / "notes.txt").write_text("mine")  # and one file not tfshards'
    listed = {v.name: v for v in prune(PruneConfig(manifest=str(tmp_path / "m.json"))).versions}
    assert listed[trash.name].reason == (
        "holds a file tfshards did not write (index/notes.txt), so it stays"
    )
    (trash / "index" / "notes.txt").unlink()
    report = prune(PruneConfig(manifest=str(tmp_path / "m.json"), delete=True))
    assert {v.name: v.action for v in report.versions}[trash.name] == "deleted"
    assert not trash.exists()


def test_two_prunes_at_once_both_succeed(versions, tmp_path):
    out = tmp_path / "shards"
    proc = _blocked_prune(tmp_path)
    try:  # the second prune finishes what the first renamed away, and deletes the rest
        report = prune(PruneConfig(manifest=str(tmp_path / "m.json"), delete=True))
    finally:
        (tmp_path / "flags" / "go").touch()
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert "deleted 3" in stdout, stdout
    assert sum(v.action == "deleted" for v in report.versions) == 3
    left = sorted(p.name for p in out.iterdir())
    assert left == sorted(["00000000deadbeef", "notes", versions["seed4"]])


def test_a_local_prune_on_a_full_disk_still_frees_space(versions, tmp_path, monkeypatch):
    """Deleting writes nothing on a local disk (a marker file failed there with ENOSPC)."""
    from tfshards import atomicfile

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomicfile, "write_atomic", full)
    report = prune(PruneConfig(manifest=str(tmp_path / "m.json"), delete=True))
    assert sum(v.action == "deleted" for v in report.versions) == 3


def test_a_write_given_up_is_removed_only_with_interrupted(make_raw, tmp_path):
    """A write that failed on a file (fixed since) left a version without manifest that
    no listing names again: kept by default with the way out, removed by --interrupted."""
    from tfshards.writing.config import WriteConfig
    from tfshards.writing.writer import write

    raw = make_raw(24, 16)
    bad = sorted(p for p in raw.rglob("*") if p.is_file())[5]
    good = bad.read_bytes()
    bad.write_bytes(b"not an image")
    out, copy = tmp_path / "shards", str(tmp_path / "m.json")
    config = WriteConfig(out=str(out), manifest_copy=copy, num_shards=4, executor="serial")
    with pytest.raises(InputError):
        write(config, list_files(str(raw)), progress=False)
    (failed,) = [p.name for p in out.iterdir()]
    bad.write_bytes(good)
    write(config, list_files(str(raw)), progress=False)
    for child in out.iterdir():
        _age(child)
    kept = {v.name: v for v in prune(PruneConfig(manifest=copy, delete=True)).versions}
    assert kept[failed].action == "keep" and "prune --interrupted" in kept[failed].reason
    config_i = PruneConfig(manifest=copy, delete=True, interrupted=True)
    shard = next(p.name for p in (out / failed).glob("*.tfrecord"))
    for stray in (  # files no write of this set leaves: each keeps the folder
        out / failed / "index" / "notes.txt",
        out / failed / "mydata-00000-of-00001.tfrecord",  # named like another set's shard
        out / failed / shard.replace("-of-00004", "-of-00009"),  # another shard count
    ):
        stray.write_text("mine")
        _age(out / failed)
        for asked in (config_i, PruneConfig(manifest=copy)):  # plain prune: no false way out
            state = {v.name: v for v in prune(asked).versions}[failed]
            assert state.action == "keep", stray
            assert stray.relative_to(out / failed).as_posix() in state.reason
            assert "--interrupted" not in state.reason
        stray.unlink()
    # A shard's companions before the shard (killed between them, or prune looking while a
    # write works): the write's own files, not "a file tfshards did not write".
    (out / failed / shard).unlink()
    assert (out / failed / "index" / f"{shard}.idx").exists()
    states = {v.name: v for v in prune(config_i).versions}
    assert states[failed].action == "deleted" and states[failed].reason.startswith(
        "an interrupted write"
    )
    assert sorted(p.name for p in out.iterdir()) == [
        Manifest.from_json(Path(copy).read_bytes()).fingerprint
    ]


def test_interrupted_spares_a_recent_write_and_one_holding_a_live_lease(versions, tmp_path):
    out = tmp_path / "shards"
    config = PruneConfig(manifest=str(tmp_path / "m.json"), interrupted=True)
    assert _actions(prune(config))["00000000deadbeef"] == "delete"
    os.utime(out / "00000000deadbeef" / "x-00000-of-00001.tfrecord")  # written just now
    state = {v.name: v for v in prune(config).versions}["00000000deadbeef"]
    assert state.action == "keep" and state.reason.startswith("modified recently")
    _age(out / "00000000deadbeef")
    (out / "00000000deadbeef" / "_work").mkdir()
    lease = out / "00000000deadbeef" / "_work" / f"host-{os.getpid()}.1.lease"
    lease.write_text("")
    state = {v.name: v for v in prune(config).versions}["00000000deadbeef"]
    assert state.action == "keep" and "holds a lease" in state.reason


def test_nothing_to_delete_says_so_under_delete_too(write_set, listing, tmp_path):
    """It said "would delete 0 (0.0 MB)" after --delete, as a dry run does."""
    write_set(listing, tmp_path / "shards", manifest_copy=str(tmp_path / "m.json"))
    for delete in (False, True):
        report = prune(PruneConfig(manifest=str(tmp_path / "m.json"), delete=delete))
        assert report.summary() == f"{tmp_path / 'shards'}: 1 version, 1 kept, nothing to delete"
