"""The manifest: what a shard set holds, written last as its commit point.

A shard set is valid only once ``manifest.json`` exists in its version
directory; until then its shards are work in progress. JSON with sorted keys
and a format ``version``, so the same shards always give the same bytes.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfshards import jsonfile, storage
from tfshards.errors import ConfigError, InputError
from tfshards.format.schema import FeatureSpec, schema_from_json, schema_to_json

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"


@dataclass(frozen=True)
class Reject:
    """A listed input that did not become a record, and why."""

    path: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


@dataclass(frozen=True)
class ShardInfo:
    """One complete shard: its name, record count, size and sha256 (of the file bytes).

    ``index_sha256`` is the sha256 of its record index file
    (:data:`tfshards.writing.layout.INDEX`), or None when it has none (compressed).
    """

    name: str
    records: int
    bytes: int
    sha256: str
    index_sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "bytes": self.bytes,
            "name": self.name,
            "records": self.records,
            "sha256": self.sha256,
        }
        if self.index_sha256 is not None:
            doc["index_sha256"] = self.index_sha256
        return doc

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShardInfo:
        index = data.get("index_sha256")
        return cls(
            str(data["name"]),
            int(data["records"]),
            int(data["bytes"]),
            str(data["sha256"]),
            None if index is None else str(index),
        )


@dataclass(frozen=True)
class Manifest:
    """Everything a reader or validator needs to trust and parse a shard set.

    Attributes:
        root: URL of the version directory holding the shards (as the user gave
            the output location, so relative paths stay relative).
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

    @property
    def records(self) -> int:
        return sum(s.records for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def shard_url(self, shard: ShardInfo | str) -> str:
        name = shard if isinstance(shard, str) else shard.name
        return storage.join(self.root, name)

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
        return jsonfile.encode(doc)

    @classmethod
    def from_json(cls, data: builtins.bytes | str, source: str = "manifest") -> Manifest:
        try:
            doc = json.loads(data)
        except json.JSONDecodeError as exc:
            raise InputError(f"{source}: not valid JSON ({exc})", path=source) from exc
        version = doc.get("version") if isinstance(doc, dict) else None
        if version != FORMAT_VERSION:
            raise InputError(
                f"{source}: manifest format version {version!r} is not supported "
                f"(expected {FORMAT_VERSION})",
                path=source,
            )
        try:
            return cls(
                root=str(doc["root"]),
                fingerprint=str(doc["fingerprint"]),
                params=dict(doc["params"]),
                schema=schema_from_json(doc["schema"]),
                labels=tuple(str(x) for x in doc["labels"]),
                compression=str(doc["compression"]),
                shards=tuple(ShardInfo.from_json(s) for s in doc["shards"]),
                rejected=tuple(Reject(str(r["path"]), str(r["reason"])) for r in doc["rejected"]),
                listed=int(doc["totals"]["listed"]),
                version=int(version),
                metadata_files={str(k): str(v) for k, v in doc.get("metadata_files", {}).items()},
            )
        except (AttributeError, KeyError, TypeError, ValueError, ConfigError) as exc:
            raise InputError(f"{source}: malformed manifest ({exc!r})", path=source) from exc


def load(url: str, **storage_options: Any) -> Manifest:
    """Read a manifest from a local path or any fsspec URL."""
    fs, path = storage.open_url(url, **storage_options)
    try:
        data = storage.read_bytes(fs, path)
    except FileNotFoundError:
        raise InputError(f"{url}: manifest not found", path=url) from None
    return Manifest.from_json(data, source=url)


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
        tuple(Reject(r["path"], r["reason"]) for r in doc["rejected"]),
        schema_from_json(doc["schema"]),
    )
