"""Find, and on request delete, the version directories no kept manifest references.

A shard location fills up with one version directory per content and params
(:func:`tfshards.writing.plan.fingerprint`). The versions referenced by the current
manifest, by the manifest at the tip of each git branch, tag and DVC experiment, and
optionally by the manifest as it was in HEAD's last N commits
(:mod:`tfshards.project.committed`) are kept.
Of the others, only finished ones are candidates: a version without
``manifest.json``, with a writer's temp file or live lease
(:mod:`tfshards.shardset.lease`: a writer re-writing a finished version holds
one while it reuses the old shards), or with a file modified within
``min_age`` seconds may be being written, and is never touched. Only folders
named like a fingerprint (16 hex digits) are considered; anything else under
the location is left alone.

On a local disk a version is deleted by renaming its folder to a hidden
``.<name>.deleting`` beside it (one atomic step that needs no free space),
then removing that: a prune killed half-way leaves the hidden folder, which
the next prune removes, and never a half-deleted version under its own name. On
an object store (no atomic rename of a folder) a marker file goes in first,
then the manifest goes, then every other file, the marker last; a version
found with the marker and no manifest is finished by the next prune. Either
way a lease is looked for again after the first step: a writer that started in
between keeps its folder, or, where it was already gone, fails its own final
check instead of publishing a manifest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import posixpath
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tfshards import atomicfile, storage
from tfshards.errors import ConfigError, InputError
from tfshards.project import committed, dvccache
from tfshards.shardset import layout, lease
from tfshards.shardset.layout import MANIFEST_NAME
from tfshards.shardset.manifest import load

DEFAULT_MIN_AGE_S = 3600.0  # a writer rewrites a shard well within an hour of its last one
_VERSION_NAME = re.compile(r"^[0-9a-f]{16}$")
_TRASH = re.compile(r"^\.([0-9a-f]{16})\.deleting$")  # a local version being deleted
Action = Literal["keep", "delete", "deleted"]
INTERRUPTED_DELETE = "an interrupted delete"  # the reason prune finishes one
INTERRUPTED_WRITE = "an interrupted write: no manifest.json, and its writer is gone"
NOT_REFERENCED = "not referenced"
NOT_CACHED = (  # what write.old_versions: remove keeps (PruneConfig.cached_only)
    "DVC's cache does not hold it (written outside `dvc repro`?), so it exists nowhere "
    "else; `tfshards prune --delete` removes it"
)
UNPUBLISHED = (  # a folder without manifest that plain prune keeps
    "no manifest.json: being written, or interrupted (rerun write; once its write is given "
    "up, prune --interrupted removes it)"
)


@dataclass(frozen=True)
class PruneConfig:
    """What to prune and what to keep; validated on construction.

    Attributes:
        manifest: the current ``manifest.json`` (path or URL); its version is kept.
        out: the shard location holding the version directories; None: the
            folder of the current manifest's version.
        keep_commits: also keep the versions the manifest referenced in the
            last N git commits that changed it (or ``dvc.lock``).
        keep_refs: also keep the versions the manifest references at the tip of
            each git branch (local or remote), tag and DVC experiment (outside git: none).
        min_age_s: a version with a file modified more recently is kept.
        delete: delete the unreferenced versions (default: only list them).
        interrupted: also take a version without ``manifest.json`` whose writer is
            gone (no live lease, nothing modified within ``min_age_s``): a write that
            failed or was killed and will not be resumed (its listing changed).
        storage_options: fsspec options for ``out``.
        cached_only: delete a published version only where the DVC cache of the
            project around ``out`` holds it (:mod:`tfshards.project.dvccache`); one
            written outside ``dvc repro`` exists nowhere else, and is kept.
    """

    manifest: str
    out: str | None = None
    keep_commits: int = 0
    keep_refs: bool = True
    min_age_s: float = DEFAULT_MIN_AGE_S
    delete: bool = False
    interrupted: bool = False
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    cached_only: bool = False

    def __post_init__(self) -> None:
        if self.keep_commits < 0:
            raise ConfigError(f"keep_commits must be >= 0, got {self.keep_commits}")
        if not self.min_age_s >= 0:  # NaN too: it compares false, so nothing looked recent
            raise ConfigError(f"min_age_s must be >= 0, got {self.min_age_s}")


@dataclass(frozen=True)
class VersionState:
    """One version directory, what prune does with it and why."""

    name: str
    action: Action
    reason: str
    files: int
    bytes: int
    linked: tuple[tuple[int, int, int], ...] = ()  # (inode, links, size) of hard-linked files

    def __str__(self) -> str:
        verb = {"keep": "keep", "delete": "would delete", "deleted": "deleted"}[self.action]
        size = f"{self.files} files, {self.bytes / 1e6:.1f} MB"
        return f"{verb:<12} {self.name}  ({size}): {self.reason}"


@dataclass(frozen=True)
class PruneReport:
    """Every version directory found under ``out``, in name order."""

    out: str
    versions: tuple[VersionState, ...]

    def summary(self) -> str:
        kept = [v for v in self.versions if v.action == "keep"]
        gone = [v for v in self.versions if v.action != "keep"]
        total = sum(v.bytes for v in gone)
        freed = _freed(gone)
        deleted = any(v.action == "deleted" for v in gone)
        verb = "deleted" if deleted else "would delete"
        tail = "" if deleted or not gone else "; run with --delete to delete them"
        size = f"{total / 1e6:.1f} MB"
        if freed != total:  # a grown version's kept shards are hard links of its base's
            size = (
                f"{freed / 1e6:.1f} MB freed; their files hold {total / 1e6:.1f} MB counting "
                "each hard link, shared among them or with versions kept"
            )
        versions = (
            f"{self.out}: {len(self.versions)} version{'' if len(self.versions) == 1 else 's'}"
        )
        if not gone:  # "would delete 0 (0.0 MB)" under --delete read as a dry run
            return f"{versions}, {len(kept)} kept, nothing to delete"
        return f"{versions}, {len(kept)} kept, {verb} {len(gone)} ({size}){tail}"


def _freed(gone: Sequence[VersionState]) -> int:
    """Bytes deleting the ``gone`` versions frees: each file not hard-linked, and once each
    file whose links all lie among them (one linked from a version kept stays)."""
    seen: dict[int, list[int]] = {}  # inode: [links, size, times among the gone]
    for version in gone:
        for inode, links, size in version.linked:
            seen.setdefault(inode, [links, size, 0])[2] += 1
    linked = sum(size * times for _, size, times in seen.values())
    whole = sum(size for links, size, times in seen.values() if times >= links)
    return sum(v.bytes for v in gone) - linked + whole


def prune(config: PruneConfig, *, now: float | None = None) -> PruneReport:
    """List the version directories under the shard location; delete if ``config.delete``.

    Raises:
        ConfigError: the current manifest's version is not under ``out`` (a
            wrong location would make every version look unreferenced).
        InputError: the manifest, or one of the last ``keep_commits`` ones or a branch's
            or experiment's, cannot be read.
    """
    if config.keep_refs:  # a URL manifest in a repository: refused before it is read
        committed.in_repository(config.manifest)
    current = load(config.manifest)
    out = config.out or posixpath.dirname(current.directory.rstrip("/"))
    referenced = {current.fingerprint: "current manifest"}
    for commit, manifest in committed.history(config.manifest, config.keep_commits):
        referenced.setdefault(manifest.fingerprint, f"manifest at commit {commit[:10]}")
    for ref, manifest in committed.at_refs(config.manifest) if config.keep_refs else ():
        referenced.setdefault(manifest.fingerprint, f"manifest of {ref}")
    fs, base = storage.open_url(out, **config.storage_options)
    try:
        listed = fs.ls(base, detail=True)
    except FileNotFoundError:
        raise InputError(f"{out}: shard location not found", path=out) from None
    if storage.is_local(fs) and not fs.isdir(base):  # ls of a file lists the file itself
        raise ConfigError(
            f"{out}: expected the folder of the shard versions (--out), found a file",
            option="out",
        )
    names = sorted(
        storage_name
        for info in listed
        if info.get("type") == "directory"
        and _VERSION_NAME.match(storage_name := posixpath.basename(str(info["name"]).rstrip("/")))
    )
    if current.fingerprint not in names:
        raise ConfigError(
            f"{out}: expected the current version {current.fingerprint} (from "
            f"{config.manifest}) in this shard location, found {len(names)} other versions"
        )
    clock = time.time() if now is None else now
    states = [
        _trash(fs, info, config.delete, config.storage_options)
        for info in listed
        if _is_trash(info)
    ]
    for name in names:
        path = storage.join(base, name)
        files = _files(fs, path)
        if not files and not fs.exists(path):  # another prune deleted it meanwhile
            states.append(VersionState(name, "deleted", "deleted by another prune", 0, 0))
            continue
        state = _decide(name, files, referenced.get(name), clock, config)
        if state.reason in (INTERRUPTED_WRITE, UNPUBLISHED):  # a file of the user's: say so
            state = _written_files_only(path, files, state)
        elif state.action == "delete" and state.reason != INTERRUPTED_DELETE:
            state = _own_files_only(fs, path, files, state, config.storage_options)
        if state.action == "delete" and config.cached_only and state.reason == NOT_REFERENCED:
            state = _cached_only(fs, path, state)
        if state.action == "delete" and config.delete:
            state = _delete(fs, base, name, state)
        states.append(state)
    return PruneReport(out, tuple(sorted(states, key=lambda v: v.name)))


def _cached_only(fs: Any, path: str, state: VersionState) -> VersionState:
    """``state`` kept unless the DVC cache of the project around ``path`` holds the version's
    manifest (local folders only: ``write.old_versions: remove`` works on no other)."""
    project = dvccache.project_of(path) if storage.is_local(fs) else None
    manifest = storage.join(path, MANIFEST_NAME)
    if project is not None and dvccache.holds(project, manifest):
        return state
    return dataclasses.replace(state, action="keep", reason=NOT_CACHED)


def _files(fs: Any, path: str) -> dict[str, Any]:
    """Every file under ``path`` with its details; {} when it is gone."""
    try:
        return dict(fs.find(path, detail=True))
    except FileNotFoundError:
        return {}


def _is_trash(info: Mapping[str, Any]) -> bool:
    name = posixpath.basename(str(info["name"]).rstrip("/"))
    return info.get("type") == "directory" and _TRASH.match(name) is not None


def _trash(
    fs: Any, info: Mapping[str, Any], delete: bool, options: Mapping[str, Any]
) -> VersionState:
    """A hidden ``.<name>.deleting`` folder a killed prune left, named as it is on disk:
    removed (on ``delete``) when it holds only what tfshards wrote there and no writer
    holds a lease on it; kept, with the reason, otherwise."""
    path = str(info["name"]).rstrip("/")
    files = _files(fs, path)
    state = VersionState(
        posixpath.basename(path),
        "delete",
        INTERRUPTED_DELETE,
        len(files),
        sum(int(f.get("size") or 0) for f in files.values()),
    )
    holders = lease.live_holders(files)
    if holders:  # the prune that renamed it is giving it back to a writer
        return dataclasses.replace(
            state, action="keep", reason=f"a writer ({holders[0]}) holds a lease on it"
        )
    if posixpath.join(path, MANIFEST_NAME) in files:
        state = _own_files_only(fs, path, files, state, options)
    elif files:  # the delete was killed after the manifest went (files go in any order)
        base = path.rstrip("/") + "/"
        state = _kept_for([r for f in files if not _version_file(r := str(f)[len(base) :])], state)
    if state.action != "delete" or not delete:
        return state
    _remove(fs, path)
    return dataclasses.replace(state, action="deleted")


def _version_file(rel: str) -> bool:
    """Whether ``rel`` is a path a version folder's files take: a shard or the version's
    own files on top, a shard's companion, a temp file or a lease in its folders."""
    folder, name = posixpath.split(rel)
    if atomicfile.is_temp_name(name) or lease.is_lease(rel):
        return not folder or folder in layout.FOLDERS
    if rel in layout.expected_paths(()) or (not folder and layout.SHARD_NAME.fullmatch(name)):
        return True
    return layout.SHARD_NAME.fullmatch(_companion_of(rel)) is not None


def _remove(fs: Any, path: str) -> None:
    """Delete the folder ``path`` and all it holds: gone already is no error."""
    try:
        fs.rm(path, recursive=True)
    except FileNotFoundError:  # another prune finished it
        pass
    except OSError as exc:  # read-only, permissions: one line naming the folder
        raise storage.write_error(fs, path, exc) from None


def _decide(
    name: str,
    files: Mapping[str, Mapping[str, Any]],
    reference: str | None,
    now: float,
    config: PruneConfig,
) -> VersionState:
    count = len(files)
    size = sum(int(info.get("size") or 0) for info in files.values())
    linked = tuple(  # local files only: object stores have no links
        (int(info["ino"]), int(info["nlink"]), int(info.get("size") or 0))
        for info in files.values()
        if int(info.get("nlink") or 1) > 1 and "ino" in info
    )

    def state(action: Action, reason: str) -> VersionState:
        return VersionState(name, action, reason, count, size, linked)

    if reference is not None:
        return state("keep", f"referenced by the {reference}")
    names = {posixpath.basename(str(p)) for p in files}
    deleting = any(str(p).endswith("/" + layout.DELETING) for p in files)
    written = MANIFEST_NAME not in names and not deleting  # a write's, never published
    if written and not config.interrupted:
        return state("keep", UNPUBLISHED)
    holders = lease.live_holders(files, now=now)
    if holders:
        return state("keep", f"a writer ({holders[0]}) holds a lease on it")
    if not written and any(atomicfile.is_temp_name(n) for n in names):
        return state("keep", "holds a temp file: a writer may be working in it")
    if deleting and MANIFEST_NAME not in names:  # a delete interrupted after the manifest went
        return state("delete", INTERRUPTED_DELETE)
    newest = max(
        (
            lease.modified(info)
            for path, info in files.items()
            # a lease is judged by its holder above, not by when it was last refreshed
            if not lease.is_lease(str(path))
        ),
        default=0.0,
    )
    if newest > now - config.min_age_s:
        return state("keep", "modified recently: a writer may be working in it")
    return state("delete", INTERRUPTED_WRITE if written else NOT_REFERENCED)


def _written_files_only(path: str, files: Mapping[str, Any], state: VersionState) -> VersionState:
    """``state``, or a keep when a version without manifest holds a file a write does not
    leave (its shards on top, their companions, temp files and leases)."""
    base = path.rstrip("/") + "/"
    rels = [str(name)[len(base) :] for name in files]
    own = layout.expected_paths(_write_shards(rels))
    foreign = [
        rel
        for rel in rels
        if rel not in own
        and not (atomicfile.is_temp_name(posixpath.basename(rel)) and _in_own_folder(rel))
    ]
    return _kept_for(foreign, state)


def _write_shards(rels: Sequence[str]) -> list[str]:
    """The shards one write left or is leaving: named ``<name>-i-of-n`` with one ``name``
    and ``n`` (and ``i < n``), on the version's top level or named by a companion (a
    write in progress, or killed, may hold a shard's companion before the shard), those
    its resume records name most, else the most numerous. A file named like a shard of
    another set is not among them."""
    kinds: dict[tuple[str, str], set[str]] = {}
    for rel in rels:
        name = rel if "/" not in rel else _companion_of(rel)
        found = layout.SHARD_NAME.fullmatch(name) if name else None
        if found and int(found["index"]) < int(found["count"]):
            kinds.setdefault((found["prefix"], found["count"]), set()).add(name)
    present = set(rels)

    def weight(kind: tuple[str, str]) -> tuple[int, int]:
        names = kinds[kind]
        return sum(layout.SIDECAR.path(n) in present for n in names), len(names)

    return sorted(kinds[max(kinds, key=weight)]) if kinds else []


def _companion_of(rel: str) -> str:
    """The shard whose companion ``rel`` is by its folder and suffix, or ""."""
    folder, name = posixpath.split(rel)
    for companion in layout.COMPANIONS:
        if companion.folder == folder and name.endswith(companion.suffix):
            return name[: -len(companion.suffix)]
    return ""


def _in_own_folder(rel: str) -> bool:
    """``rel`` is on the version's top level or in one of its bookkeeping folders."""
    folder = posixpath.dirname(rel)
    return not folder or folder in layout.FOLDERS


def _own_files_only(
    fs: Any,
    path: str,
    files: Mapping[str, Any],
    state: VersionState,
    options: Mapping[str, Any],
) -> VersionState:
    """``state``, or a keep when the folder holds a file tfshards did not write there (one
    its manifest, the shards it lists and their bookkeeping do not account for)."""
    try:
        manifest = load(storage.unstrip(fs, storage.join(path, MANIFEST_NAME)), **options)
    except InputError as exc:
        return dataclasses.replace(state, action="keep", reason=f"its manifest: {exc}")
    own = layout.expected_paths(s.name for s in manifest.shards)
    base = path.rstrip("/") + "/"
    return _kept_for([rel for name in files if (rel := str(name)[len(base) :]) not in own], state)


def _kept_for(foreign: list[str], state: VersionState) -> VersionState:
    """``state``, or a keep naming the first of ``foreign`` (paths in the version that
    tfshards did not write there; a lease is always its own)."""
    foreign = sorted(rel for rel in foreign if not lease.is_lease(rel))
    if not foreign:
        return state
    what = f"{len(foreign)} files" if len(foreign) > 1 else "a file"
    return dataclasses.replace(
        state,
        action="keep",
        reason=f"holds {what} tfshards did not write ({foreign[0]}), so it stays",
    )


def _delete(fs: Any, base: str, name: str, state: VersionState) -> VersionState:
    """Delete the version ``name`` under ``base``; a writer's lease found after the first
    step keeps it (see the module's docstring)."""
    path = storage.join(base, name)
    if storage.is_local(fs):
        return _delete_local(fs, path, storage.join(base, f".{name}.deleting"), state)
    marker = storage.join(path, layout.DELETING)
    atomicfile.write_atomic(fs, marker, [b"prune\n"], sync_dir=False)
    with contextlib.suppress(FileNotFoundError):  # gone already: an interrupted delete
        fs.rm(storage.join(path, MANIFEST_NAME))
    files = _files(fs, path)
    holders = lease.live_holders(files)
    if holders:
        return dataclasses.replace(
            state, action="keep", reason=f"a writer ({holders[0]}) took a lease on it"
        )
    rest = [f for f in files if posixpath.basename(str(f)) != layout.DELETING]
    with contextlib.suppress(FileNotFoundError):  # another prune deletes them too
        fs.rm(rest)
    with contextlib.suppress(FileNotFoundError):
        fs.rm(marker)
    return dataclasses.replace(state, action="deleted")


def _delete_local(fs: Any, path: str, trash: str, state: VersionState) -> VersionState:
    try:
        os.rename(path, trash)  # the version is gone under its name, at once
    except FileNotFoundError:
        return dataclasses.replace(state, action="deleted", reason="deleted by another prune")
    except OSError as exc:
        raise storage.write_error(fs, path, exc) from None
    holders = lease.live_holders(_files(fs, trash))
    if holders:
        with contextlib.suppress(OSError):  # the writer made the folder anew: it fails alone
            os.rename(trash, path)
            return dataclasses.replace(
                state, action="keep", reason=f"a writer ({holders[0]}) took a lease on it"
            )
    _remove(fs, trash)
    return dataclasses.replace(state, action="deleted")


__all__ = [
    "DEFAULT_MIN_AGE_S",
    "PruneConfig",
    "PruneReport",
    "VersionState",
    "prune",
]
