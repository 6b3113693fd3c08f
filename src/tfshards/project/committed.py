"""The manifests a git repository records: in HEAD's last commits, and at the tip of every
branch and DVC experiment, each read through DVC (a DVC-tracked manifest comes from the DVC
cache or remote).

``prune`` keeps their versions. An experiment (``dvc exp run``: a commit under
``refs/exps/``) and another branch record versions HEAD's history does not, and on an
object store a version deleted is gone for good.

The manifest may sit in a DVC project that is a folder of the git repository
(``dvc init --subdir``): git names its ``dvc.lock`` from the repository's top
(``sub/dvc.lock``), the lock names the manifest from the project
(``data/manifest.json``), and ``dvc.api.read`` takes the path from the top.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import posixpath
import re
import subprocess
from dataclasses import dataclass

from tfshards.errors import InputError
from tfshards.project import dvclock, plainyaml
from tfshards.shardset.manifest import Manifest

_EXPERIMENT = re.compile(r"^refs/exps/[0-9a-f]{2}/[0-9a-f]{38}/(?P<name>[^/]+)$")
_KINDS = (("refs/heads/", "branch"), ("refs/remotes/", "remote branch"), ("refs/tags/", "tag"))
_ALL_REFS = ("refs/heads", "refs/remotes", "refs/tags", "refs/exps")
_REF_WAY_OUT = (
    "run `dvc fetch` for it (or `dvc pull`), or pass --no-keep-refs to keep only the current "
    "manifest's version and those --keep-commits names"
)


@dataclass(frozen=True)
class Tracked:
    """Where git and DVC record one manifest.

    Attributes:
        top: the git repository's top folder.
        rel: the manifest, relative to ``top`` (how git and ``dvc.api.read`` name it).
        lock: its DVC project's ``dvc.lock``, relative to ``top``.
        out: the manifest relative to its DVC project (how ``dvc.lock`` names it).
        path: the manifest's absolute path.
        md5: the md5 of the manifest in the workspace ("" when it cannot be read).
    """

    top: str
    rel: str
    lock: str
    out: str
    path: str
    md5: str


def tracked(manifest: str) -> Tracked:
    """Where the repository holding ``manifest`` records it.

    Raises:
        InputError: a URL (git names no URL: the manifest's path in the repository is
            needed), not in a git repository, or git cannot run.
    """
    if "://" in manifest:
        raise InputError(
            f"{manifest}: expected the manifest's path in the git repository "
            "(data/manifest.json), found a URL",
            path=manifest,
        )
    path = os.path.abspath(manifest)
    folder = os.path.dirname(path)
    top = os.path.realpath(_git(folder, "rev-parse", "--show-toplevel").strip())
    # The folder's links resolved, not the file's: DVC's cache.type symlink makes the
    # manifest a link into .dvc/cache, where no commit names it.
    folder = os.path.realpath(folder)
    path = os.path.join(folder, os.path.basename(path))
    project = folder  # the nearest folder with a .dvc/ up to the top: the DVC project
    while project != top and not os.path.isdir(os.path.join(project, ".dvc")):
        project = os.path.dirname(project)

    def rel(target: str, start: str) -> str:
        return os.path.relpath(target, start).replace(os.sep, "/")

    lock = rel(os.path.join(project, "dvc.lock"), top)
    try:
        with open(path, "rb") as f:
            md5 = hashlib.md5(f.read(), usedforsecurity=False).hexdigest()
    except OSError:
        md5 = ""
    return Tracked(top, rel(path, top), lock, rel(path, project), path, md5)


def history(manifest: str, commits: int) -> list[tuple[str, Manifest]]:
    """``(commit, manifest)`` as it was in each of the last ``commits`` commits of HEAD
    that changed it: the file itself, its ``.dvc`` file or its project's ``dvc.lock``. A
    commit where the manifest did not exist is skipped.

    Raises:
        InputError: not in a git repository, or a commit's manifest cannot be read.
    """
    if commits == 0:
        return []
    try:
        t = tracked(manifest)
    except InputError as exc:
        raise InputError(
            f"--keep-commits {commits} reads the manifest's git history: {exc}", path=manifest
        ) from None
    if not _commit(t.top):
        return []  # an unborn branch: no history to keep
    shas = _git(
        t.top, "log", f"-n{commits}", "--format=%H", "--", t.rel, f"{t.rel}.dvc", t.lock
    ).split()
    way_out = "run `dvc fetch` for that commit, or lower --keep-commits"
    return [(sha, m) for sha in shas for m in _manifests_at(t, sha, f"commit {sha[:10]}", way_out)]


def at_refs(manifest: str) -> list[tuple[str, Manifest]]:
    """``(what, manifest)`` at HEAD and the tip of each branch (local and remote-tracking),
    tag and DVC experiment that records another manifest than the workspace's (``what``:
    ``"HEAD"``, ``"branch main"``, ``"tag v1"``, ``"experiment s7"``); none outside a git
    repository.

    A tip whose lock (or ``.dvc`` file) records the workspace manifest's md5, or one an
    earlier tip's, is that manifest: it is not read again (~0.15 s a read through DVC here),
    so a clone holding only the current version's data prunes all the same. A ref to
    anything but a commit (a tag of a file) is passed over.

    Raises:
        InputError: a tip records another manifest and it cannot be read (not in the DVC
            cache, nor on the remote); a URL for ``manifest`` in a git repository (which
            refs name which version cannot be told).
    """
    if not in_repository(manifest):
        return []
    t = tracked(manifest)
    refs = _git(
        t.top,
        "for-each-ref",
        "--format=%(refname) %(objectname) %(objecttype) %(*objectname) %(*objecttype)",
        *_ALL_REFS,
    )
    tips = [("HEAD", head, "commit", "", "")] if (head := _commit(t.top)) else []
    tips += [tuple(line.split(" ")) for line in refs.splitlines()]  # type: ignore[misc]
    found, seen, read = [], set(), {t.md5}  # md5s whose manifest is kept already
    for name, sha, kind, peeled, peeled_kind in tips:
        sha, kind = (peeled, peeled_kind) if peeled else (sha, kind)  # an annotated tag
        if kind == "tag":  # a tag of a tag: peeled all the way
            sha, kind = _commit(t.top, sha), "commit"
        what, way_out = _ref(name)
        if not what or kind != "commit" or not sha or sha in seen:
            continue
        seen.add(sha)
        md5 = _recorded_md5(t, sha)
        if md5 is not None and md5 in read:
            continue  # the workspace's manifest, or one an earlier tip named: kept already
        found += [(what, m) for m in _manifests_at(t, sha, f"{what} ({sha[:10]})", way_out)]
        read.add(md5 or "")
    return found


def in_repository(manifest: str) -> bool:
    """Whether ``manifest`` is in a git repository (a URL: whether the working directory
    is, where no ref can be told to name it).

    Raises:
        InputError: a URL in a git repository (:func:`tracked`'s one line).
    """
    url = "://" in manifest
    folder = os.getcwd() if url else os.path.dirname(os.path.abspath(manifest))
    try:
        _git(folder, "rev-parse", "--show-toplevel")
    except InputError:
        return False
    if url:
        tracked(manifest)  # refuses the URL
    return True


def _commit(top: str, rev: str = "HEAD") -> str:
    """The commit ``rev`` (HEAD) names; "" when none (an unborn branch, a tag of a file)."""
    try:
        return _git(top, "rev-parse", "--verify", "-q", f"{rev}^{{commit}}").strip()
    except InputError:
        return ""


def _ref(name: str) -> tuple[str, str]:
    """What a ref is called in a line, and the way out when its manifest cannot be read;
    ``("", "")`` for refs not kept (DVC's bookkeeping, a remote's ``HEAD``)."""
    if name == "HEAD":
        return "HEAD", _REF_WAY_OUT
    experiment = _EXPERIMENT.match(name)
    if experiment:
        label = experiment["name"]
        return f"experiment {label}", f"run `dvc exp pull` for it, or `dvc exp remove {label}`"
    for prefix, kind in _KINDS:
        if name.startswith(prefix) and not name.endswith("/HEAD"):
            return f"{kind} {name.removeprefix(prefix)}", _REF_WAY_OUT
    return "", ""


def _recorded_md5(t: Tracked, sha: str) -> str | None:
    """The md5 commit ``sha`` records for the manifest: in its project's ``dvc.lock``, or
    in the manifest's ``.dvc`` file; None where it records none."""
    with contextlib.suppress(InputError):
        lock = _git(t.top, "show", f"{sha}:{t.lock}")
        md5 = dvclock.recorded_md5(t.path, os.path.join(t.top, t.lock), lock)
        if md5 is not None:
            return md5
    with contextlib.suppress(InputError, AttributeError, TypeError, IndexError, KeyError):
        doc = plainyaml.parse(_git(t.top, "show", f"{sha}:{t.rel}.dvc"))
        return str(doc["outs"][0]["md5"])
    return None


def _manifests_at(t: Tracked, sha: str, where: str, way_out: str) -> list[Manifest]:
    """The manifests commit ``sha`` records: at ``t``'s path, and each one a stage of its
    pipeline writes under another path (:func:`_written_at`: a manifest renamed since,
    ``--manifest`` naming a copy, a second shard set); [] when it records none."""
    found = [m for m in [_read_at(t, sha, where, way_out)] if m is not None]
    for rel, out in _written_at(t, sha):
        other = _read_at(dataclasses.replace(t, rel=rel, out=out), sha, where, way_out)
        found += [other] if other is not None else []
    return found


def _read_at(t: Tracked, sha: str, where: str, way_out: str) -> Manifest | None:
    import dvc.api  # heavy: only when a commit is asked for
    from dvc.exceptions import DvcException, PathMissingError

    try:
        data = dvc.api.read(t.rel, repo=t.top, rev=sha, mode="rb")
    except PathMissingError as exc:
        # DVC says so too when the commit records the file but neither the cache nor the
        # remote has it: only a commit that never recorded it has no version to keep.
        if not _recorded_at(t, sha):
            return None
        raise _unreadable(t.rel, where, way_out, exc) from None
    except (DvcException, OSError) as exc:
        raise _unreadable(t.rel, where, way_out, exc) from None
    return Manifest.from_json(data, source=f"{t.rel}@{sha[:10]}")


_MANIFEST_OPTION = re.compile(r"--manifest[= ]+['\"]?([^\s'\"]+)")
_WRITES_SHARDS = re.compile(r"\btfshards\b.*\bwrite\b|\bwrite_shards\.py\b")
_DEFAULT_MANIFEST = "data/manifest.json"  # tfshards write's --manifest when none is given


def _written_at(t: Tracked, sha: str) -> list[tuple[str, str]]:
    """``(path in the repository, path in the project)`` of each manifest a stage of commit
    ``sha``'s ``dvc.lock`` records as an out and names with ``--manifest PATH`` (or, in a
    stage running tfshards' write without it, the default ``data/manifest.json``), other
    than ``t``'s: how a pipeline names its manifests whatever path prune was given."""
    try:
        doc = plainyaml.parse(_git(t.top, "show", f"{sha}:{t.lock}"))
    except InputError:
        return []
    project, found = posixpath.dirname(t.lock), []
    stages = doc.get("stages") if isinstance(doc, dict) else None
    for stage in stages.values() if isinstance(stages, dict) else ():
        if not isinstance(stage, dict):
            continue
        outs = {
            posixpath.normpath(str(o["path"]))
            for o in stage.get("outs") or ()
            if isinstance(o, dict) and o.get("path")
        }
        cmd = str(stage.get("cmd", ""))
        named = _MANIFEST_OPTION.findall(cmd)
        named += [] if named or not _WRITES_SHARDS.search(cmd) else [_DEFAULT_MANIFEST]
        for out in {posixpath.normpath(n) for n in named} & outs - {posixpath.normpath(t.out)}:
            found.append((posixpath.normpath(posixpath.join(project, out)), out))
    return sorted(found)


def _unreadable(rel: str, where: str, way_out: str, exc: Exception) -> InputError:
    why = " ".join(f"{type(exc).__name__}: {exc}".split())
    return InputError(
        f"{rel} at {where}: cannot read it to keep its version ({why}); {way_out}", path=rel
    )


def _recorded_at(t: Tracked, sha: str) -> bool:
    """Whether commit ``sha`` records the manifest: in git, in its ``.dvc`` file, or as an
    out in its project's ``dvc.lock``."""
    for path in (t.rel, f"{t.rel}.dvc"):
        with contextlib.suppress(InputError):
            _git(t.top, "cat-file", "-e", f"{sha}:{path}")
            return True
    try:
        lock = _git(t.top, "show", f"{sha}:{t.lock}")
    except InputError:
        return False
    pattern = rf"^\s*(?:-\s*)?path:\s*['\"]?{re.escape(t.out)}['\"]?\s*$"
    return re.search(pattern, lock, re.MULTILINE) is not None


def _git(cwd: str, *args: str) -> str:
    try:
        result = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=60
        )
    except OSError as exc:
        raise InputError(f"{cwd}: cannot run git ({exc.strerror})", path=cwd) from None
    if result.returncode != 0:
        why = (result.stderr.strip().splitlines() or ["failed"])[-1]
        raise InputError(f"{cwd}: git {args[0]}: {why}", path=cwd)
    return result.stdout
