"""The manifest: what a shard set holds, written last as its commit point.

A shard set is valid only once ``manifest.json`` exists in its version
directory; until then its shards are work in progress. JSON with sorted keys
and a format ``version``, so the same shards always give the same bytes.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import hashlib
import json
import os
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfshards import jsonfile, storage
from tfshards.errors import ConfigError, InputError
from tfshards.format.columns import Column, parse_columns
from tfshards.format.schema import FeatureSpec, schema_from_json, schema_to_json
from tfshards.shardset import manifestfields as fields
from tfshards.shardset.layout import MANIFEST_NAME
from tfshards.shardset.resize import Resize

FORMAT_VERSION = 1
# Where the walk up from a manifest copy stops looking for its version directory:
# the writer ran inside the project (a DVC stage runs in the folder of dvc.yaml).


@dataclass(frozen=True)
class Reject:
    """A listed input that did not become a record, and why.

    ``token`` is the listing's content token of a file whose bytes were the
    problem (not an image, too large): a later version grown from this one
    leaves the file out again, unread, while its token is the same. A reject
    that reading itself caused (permissions, I/O) has none and is tried again.
    """

    path: str
    reason: str
    token: str = ""

    def to_json(self) -> dict[str, str]:
        doc = {"path": self.path, "reason": self.reason}
        if self.token:  # absent otherwise: sets without content rejects keep their bytes
            doc["token"] = self.token
        return doc


def _keys(doc: Any) -> str:
    """A few of a JSON document's keys, or its type, for an error line."""
    if not isinstance(doc, dict):
        return f"of type {type(doc).__name__}"
    names = sorted(map(str, doc))
    return "with keys " + ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")


@dataclass(frozen=True)
class ShardInfo:
    """One complete shard: its name, record count, size and sha256 (of the file bytes).

    ``index_sha256`` is the sha256 of its record index file
    (:data:`tfshards.shardset.layout.INDEX`), or None when it has none (compressed).
    ``bucket`` is the split bucket all its records hash to
    (:mod:`tfshards.shardset.buckets`), and ``records_sha256`` the sha256 of its
    member list (:data:`tfshards.shardset.layout.RECORDS`); both None in sets
    written before buckets.
    """

    name: str
    records: int
    bytes: int
    sha256: str
    index_sha256: str | None = None
    bucket: int | None = None
    records_sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "bytes": self.bytes,
            "name": self.name,
            "records": self.records,
            "sha256": self.sha256,
        }
        for key in ("index_sha256", "bucket", "records_sha256"):  # absent, not null
            if getattr(self, key) is not None:
                doc[key] = getattr(self, key)
        return doc

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShardInfo:
        index, bucket, members = (data.get(k) for k in ("index_sha256", "bucket", "records_sha256"))
        return cls(
            str(data["name"]),
            int(data["records"]),
            int(data["bytes"]),
            str(data["sha256"]),
            None if index is None else str(index),
            None if bucket is None else int(bucket),
            None if members is None else str(members),
        )


@dataclass(frozen=True)
class Manifest:
    """Everything a reader or validator needs to trust and parse a shard set.

    Attributes:
        root: URL of the version directory holding the shards as the writer
            spelled it: a relative path is relative to the writer's working
            directory, so the bytes are the same in every clone. Reach files
            through :attr:`directory`, never ``root``.
        fingerprint: hash of the inputs and parameters that named ``root``.
        params: the write parameters that shaped the bytes.
        schema: feature specs of every record.
        labels: label names; a record's ``label`` is an index into it.
        compression: ``"none"``, ``"gzip"`` or ``"zlib"``.
        shards: the shards, in order.
        rejected: inputs left out (``on_error=skip``), with reasons.
        listed: number of inputs in the listing (``listed == records + len(rejected)``).
        metadata_files: other files of the version directory (paths relative
            to it, e.g. the TensorFlow Datasets metadata) and their sha256.
        base: the fingerprint of the version this one grew from (its kept shards
            are that version's bytes); empty for a set written from scratch.
        changes: what changed since ``base``, as counts
            (:meth:`tfshards.shardset.diff.Changes.to_metrics`); empty without a base.
        resolved_root: where :func:`load` found the version directory; never
            written. Empty: ``root`` as written (the writer's own manifest).
    """

    root: str
    fingerprint: str
    params: Mapping[str, Any]
    schema: tuple[FeatureSpec, ...]
    labels: tuple[str, ...]
    compression: str
    shards: tuple[ShardInfo, ...]
    rejected: tuple[Reject, ...] = ()
    listed: int = 0
    version: int = field(default=FORMAT_VERSION)
    metadata_files: Mapping[str, str] = field(default_factory=dict)
    base: str = ""
    changes: Mapping[str, int] = field(default_factory=dict)
    resolved_root: str = field(default="", compare=False, repr=False)
    resolved_for: str = field(default="", compare=False, repr=False)  # the root it resolves

    @property
    def directory(self) -> str:
        """URL of the version directory: as :func:`load` resolved it, else ``root``.

        A copy with another ``root`` (``dataclasses.replace``) is read from that root.
        """
        if self.resolved_root and self.resolved_for == self.root:
            return self.resolved_root
        return self.root

    @property
    def records(self) -> int:
        return sum(s.records for s in self.shards)

    # What readers need from the write parameters, typed: no caller reads ``params`` by key.
    @property
    def image_feature(self) -> str:
        """The feature holding each record's image (the raw file bytes, unless transformed)."""
        return str(self.params.get("image_feature", "image"))

    @property
    def transform(self) -> str | None:
        """The transform that wrote the records (``"none"``: the files as listed; None: unknown)."""
        value = self.params.get("transform")
        return None if value is None else str(value)

    @property
    def group_by(self) -> str | None:
        """The ``group_by`` pattern the set was written with (None: written without one)."""
        value = self.params.get("group_by")
        return None if value is None else str(value)

    @property
    def resize(self) -> Resize | None:
        """How the images were resized when written (None: stored as listed)."""
        return Resize.from_params(self.params)

    @property
    def label_gaps(self) -> tuple[int, ...]:
        """The ids of the label map that name no folder (ids between numeric folders,
        named ``str(k)``); none in a version written before they were kept."""
        return tuple(int(k) for k in self.params.get("label_gaps", ()))

    @property
    def columns(self) -> tuple[Column, ...]:
        """The index file's extra columns the records hold, with their bounds (empty: none)."""
        return parse_columns(self.params.get("columns"))

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def shard_url(self, shard: ShardInfo | str) -> str:
        name = shard if isinstance(shard, str) else shard.name
        return storage.join(self.directory, name)

    def to_json(self) -> builtins.bytes:
        doc = {
            "compression": self.compression,
            "fingerprint": self.fingerprint,
            "labels": list(self.labels),
            "params": dict(self.params),
            "rejected": [r.to_json() for r in self.rejected],
            "root": self.root,
            "schema": schema_to_json(self.schema),
            "shards": [s.to_json() for s in self.shards],
            "totals": {
                "bytes": self.bytes,
                "listed": self.listed,
                "records": self.records,
                "rejected": len(self.rejected),
                "shards": len(self.shards),
            },
            "version": self.version,
        }
        if self.metadata_files:  # absent, not empty: manifests without any keep their bytes
            doc["metadata_files"] = dict(sorted(self.metadata_files.items()))
        if self.base:
            doc["base"] = self.base
        if self.changes:
            doc["changes"] = dict(sorted(self.changes.items()))
        return jsonfile.encode(doc)

    @classmethod
    def from_json(cls, data: builtins.bytes | str, source: str = "manifest") -> Manifest:
        """Parse and check a manifest (:mod:`.manifestfields`); ``source`` names it.

        Raises:
            InputError: not JSON, another format version, or a field that is
                missing or wrong (one line: the field, expected, found).
        """
        try:
            doc = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"{source}: not valid JSON ({exc})", path=source) from exc
        except RecursionError:  # arrays or objects nested ~1,000 deep
            raise InputError(
                f"{source}: expected a manifest, found JSON values nested too deep to read",
                path=source,
            ) from None
        version = doc.get("version") if isinstance(doc, dict) else None
        if isinstance(doc, dict) and "shards" not in doc and "files_sha256" in doc:
            raise InputError(
                f"{source}: expected a shard set's manifest.json, found a listing's meta.json "
                "(`tfshards list` writes it; `tfshards write` makes a manifest from it)",
                path=source,
            )
        if not isinstance(doc, dict) or "shards" not in doc or "fingerprint" not in doc:
            raise InputError(
                f"{source}: expected a shard set's manifest.json (with fingerprint and "
                f"shards), found JSON {_keys(doc)}",
                path=source,
            )
        if version != FORMAT_VERSION:
            raise InputError(
                f"{source}: manifest format version {version!r} is not supported "
                f"(expected {FORMAT_VERSION})",
                path=source,
            )
        get = functools.partial(fields.get, doc)
        params = fields.mapping(source, "params", get("params"))
        try:
            schema = schema_from_json(fields.mapping(source, "schema", get("schema")))
        except (AttributeError, TypeError, ValueError) as exc:  # ConfigError is a ValueError
            what = f"{source}: schema: expected feature specs, found {exc}"
            raise InputError(what, path=source) from exc
        try:
            parse_columns(params.get("columns"))
        except ConfigError as exc:
            raise InputError(f"{source}: params: {exc}", path=source) from None
        root, fingerprint = fields.root(source, get("root"), get("fingerprint"))
        totals = fields.mapping(source, "totals", get("totals"))
        return cls(
            root=root,
            fingerprint=fingerprint,
            params=params,
            schema=schema,
            labels=fields.labels(source, get("labels"), params.get("labels")),
            compression=fields.compression(source, get("compression")),
            shards=tuple(
                ShardInfo(*s) for s in fields.shards(source, get("shards"), params.get("name"))
            ),
            rejected=tuple(Reject(*r) for r in fields.rejected(source, get("rejected"))),
            listed=fields.count(source, "totals.listed", fields.get(totals, "listed")),
            version=FORMAT_VERSION,
            metadata_files=fields.metadata_files(source, get("metadata_files")),
            base=fields.base(source, get("base")),
            changes=fields.changes(source, get("changes")),
        )


def expect(value: Any) -> Manifest:
    """``value`` when it is a :class:`Manifest`; else one line saying how to get one.

    Raises:
        ConfigError: a path, a dict or anything else given where a Manifest goes.
    """
    if isinstance(value, Manifest):
        return value
    path = isinstance(value, (str, os.PathLike))
    how = " (tfshards.load_manifest(path) reads one)" if path else ""
    raise ConfigError(f"expected a Manifest{how}, got {type(value).__name__} {value!r:.60}")


def load(url: str, **storage_options: Any) -> Manifest:
    """Read and check a manifest from a local path or any fsspec URL; find its version directory.

    The result's :attr:`Manifest.directory` is where the shards are, resolved
    from where the manifest itself is (:func:`locate`), never from the
    caller's working directory.
    """
    fs, path = storage.open_url(url, **storage_options)
    try:
        data = storage.read_bytes(fs, path)
    except (FileNotFoundError, storage.NotAFileError) as exc:
        if fs.isdir(path):  # a version directory, or the folder a manifest copy is in
            if fs.isfile(storage.join(path, MANIFEST_NAME)):
                return load(storage.join(url, MANIFEST_NAME), **storage_options)
            why = f"a folder with no {MANIFEST_NAME} in it"
        else:
            why = "manifest not found" if isinstance(exc, FileNotFoundError) else str(exc.strerror)
        raise InputError(f"{url}: {why}", path=url) from None
    manifest = Manifest.from_json(data, source=url)
    try:
        found = locate(manifest, fs, path, url)
    except InputError:  # a local link to a manifest elsewhere: its target's place holds
        real = os.path.realpath(path) if storage.is_local(fs) else path
        if real == path:
            raise
        found = locate(manifest, fs, real, url)
    return dataclasses.replace(manifest, resolved_root=found, resolved_for=manifest.root)


def locate(manifest: Manifest, fs: Any, path: str, url: str) -> str:
    """The version directory of the manifest at ``path`` on ``fs`` (``url``, for errors).

    A URL or absolute ``root`` is itself, unless the manifest lies elsewhere beside
    files of its version (a copy: it validated the original). A relative one is relative to the
    writer's working directory, which the manifest's own place recovers: a
    manifest inside a folder named by its fingerprint, or beside its first
    shard (a version directory copied under another name), is in its version
    directory: the copy is what it describes, never the original it was copied
    from (a damaged copy validated the original, OK); a copy of the manifest
    alone (the DVC-tracked ``data/manifest.json``) has ``root`` under its own
    folder or a folder above it, looked up to the project's top (the first
    folder holding ``.dvc`` or ``.git``).

    Raises:
        InputError: a relative ``root`` that is under none of those folders.
    """
    root = manifest.root
    folder = posixpath.dirname(posixpath.normpath(path))
    if storage.split_protocol(root)[0] is not None or posixpath.isabs(root):
        own = storage.unstrip(fs, folder)
        if own.rstrip("/") != root.rstrip("/") and _holds_version_files(fs, folder, manifest):
            return own  # a copy (a download of an s3:// version) is read for itself
        return root
    if in_version_folder(manifest, fs, folder):  # its own, or one copied under another name
        return storage.unstrip(fs, folder)
    found = storage.find_upward(fs, folder, root)
    if found is not None and fs.isdir(found):
        return storage.unstrip(fs, found)
    raise InputError(
        f"{url}: root: expected the version directory {root} under the manifest's folder or "
        f"one above it, up to the project's top (a folder with .dvc or .git); found it "
        f"under none from {folder} up",
        path=url,
    )


def named_labels(labels: Sequence[str], gaps: Iterable[int]) -> set[str]:
    """The names of the label map ``labels`` that are labels, not ``gaps``: what a label
    added or removed counts by (a gap is neither)."""
    skip = set(gaps)
    return {name for k, name in enumerate(labels) if k not in skip}


def in_version_folder(manifest: Manifest, fs: Any, folder: str) -> bool:
    """Whether ``folder`` (where ``manifest`` lies) is a version directory of it: named by
    its fingerprint, or holding its files (:func:`_holds_version_files`)."""
    named = posixpath.basename(folder.rstrip("/")) == manifest.fingerprint
    return named or _holds_version_files(fs, folder, manifest)


def _holds_version_files(fs: Any, folder: str, manifest: Manifest) -> bool:
    """Whether ``folder`` holds a file only a version directory of ``manifest`` holds: one
    of its shards, or TFDS metadata with the sha256 it records (a project folder may hold
    a ``label.labels.txt`` of its own: by name alone it passed for a version folder).
    A copy of a version missing its first shard was taken for a manifest copy and read
    the original above it (OK where the copy lacked a shard)."""
    try:
        names = {posixpath.basename(str(p).rstrip("/")) for p in fs.ls(folder, detail=False)}
    except (FileNotFoundError, NotADirectoryError):
        return False
    if any(shard.name in names for shard in manifest.shards):
        return True
    for name, sha in manifest.metadata_files.items():
        if name in names:
            data = storage.read_bytes(fs, posixpath.join(folder, name))
            if hashlib.sha256(data).hexdigest() == sha:
                return True
    return False


def sidecar_json(
    info: ShardInfo, rejected: Sequence[Reject], schema: Sequence[FeatureSpec]
) -> bytes:
    """The record of a finished shard (``layout.SIDECAR``): a resumed run trusts it."""
    doc = {
        "rejected": [r.to_json() for r in rejected],
        "schema": schema_to_json(schema),
        "shard": info.to_json(),
        "version": FORMAT_VERSION,
    }
    return jsonfile.encode(doc, indent=None)


def sidecar_from_json(data: bytes) -> tuple[ShardInfo, tuple[Reject, ...], tuple[FeatureSpec, ...]]:
    doc = json.loads(data)
    if doc.get("version") != FORMAT_VERSION:
        raise ValueError(f"sidecar version {doc.get('version')!r}")
    return (
        ShardInfo.from_json(doc["shard"]),
        tuple(Reject(r["path"], r["reason"], r.get("token", "")) for r in doc["rejected"]),
        schema_from_json(doc["schema"]),
    )
