"""One record of a version, found by its listed path or ``SHARD:INDEX``, read without TensorFlow.

A path is looked up in the member lists (``records/<shard>.jsonl``) of the
shards of its split bucket only, when the set is bucketed by path; a record is
then read with one seek through its shard's index file (``index/<shard>.idx``),
its CRCs checked. A compressed shard has no index file and is inflated up to
the record.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tfshards import storage
from tfshards.errors import InputError, ShardError
from tfshards.format import exampleparser, tfrecord
from tfshards.shardset import buckets, layout, members
from tfshards.shardset.manifest import Manifest, ShardInfo

_AT = re.compile(r"^(?P<shard>.+):(?P<index>\d+)$")  # SHARD:INDEX, SHARD a name or a number


@dataclass(frozen=True)
class Record:
    """A record and where it is: its shard, its place there, its listed path and label."""

    shard: str
    index: int
    path: str
    label: str
    features: Mapping[str, tuple[str, list[Any]]]


class Version:
    """A version's records, by path or by place, read from its directory."""

    def __init__(self, manifest: Manifest, **storage_options: Any) -> None:
        self.manifest = manifest
        self.fs, self.directory = storage.open_url(manifest.directory, **storage_options)
        self._rows: dict[str, list[members.Row]] = {}  # each shard's member list, once read
        self._offsets: dict[str, list[bytes]] = {}  # each shard's index file lines, once read

    def find(self, spec: str) -> Record:
        """The record ``spec`` names: a listed path, or ``SHARD:INDEX`` (a shard name or number).

        Raises:
            InputError: no such record (says what was expected and found).
        """
        at = _AT.match(spec)
        if at is not None and not self._listed(spec):
            shard = self._shard(at["shard"], spec)
            index = int(at["index"])
            if index >= shard.records:
                raise InputError(
                    f"{spec}: expected a record index below {shard.records} "
                    f"(records in {shard.name}), found {index}"
                )
            return self.read(shard, index)
        for shard, index in self._places(spec):
            return self.read(shard, index)
        rejected = next((r for r in self.manifest.rejected if r.path == spec), None)
        if rejected is not None:
            raise InputError(
                f"{spec}: left out of version {self.manifest.fingerprint} when it was "
                f"written: {rejected.reason}"
            )
        raise InputError(
            f"{spec}: no record of version {self.manifest.fingerprint} is listed under this "
            f"path ({self.manifest.records} records); expected a path relative to the "
            "listing's root, or SHARD:INDEX"
        )

    def read(self, shard: ShardInfo, index: int) -> Record:
        """Record ``index`` of ``shard``, parsed, with its member row's path and label."""
        row = self.rows(shard)[index]
        data = self._bytes(shard, index)
        try:
            features = exampleparser.decode(data)
        except exampleparser.DecodeError as exc:
            raise ShardError(
                f"{self._where(shard)}: record {index}: expected a tf.train.Example, found {exc}"
            ) from None
        return Record(shard.name, index, row[0], self.manifest.labels[row[2]], features)

    def of_label(self, label: str, shards: list[ShardInfo] | None = None) -> Iterator[Record]:
        """The records of ``label``, shard by shard in name order (of ``shards`` if given)."""
        if label not in self.manifest.labels:
            raise InputError(
                f"label {label!r}: expected one of {list(self.manifest.labels)}, found none such"
            )
        wanted = self.manifest.labels.index(label)
        for shard in shards if shards is not None else self.manifest.shards:
            for index, row in enumerate(self.rows(shard)):
                if row[2] == wanted:
                    yield self.read(shard, index)

    def rows(self, shard: ShardInfo) -> list[members.Row]:
        """The shard's member list: path, content token and label id of each record."""
        if shard.name not in self._rows:
            compression = self.manifest.compression
            self._rows[shard.name] = members.of_shard(self.fs, self.directory, shard, compression)
        return self._rows[shard.name]

    def _listed(self, spec: str) -> bool:
        return any(True for _ in self._places(spec))

    def _places(self, path: str) -> Iterator[tuple[ShardInfo, int]]:
        """Where records listed as ``path`` are: only its bucket's shards, when that is known."""
        count = int(self.manifest.params.get("buckets") or 0)
        bucketed = count and "group_by" not in self.manifest.params
        bucket = buckets.bucket_of(path, count) if bucketed else None
        for shard in self.manifest.shards:
            if bucket is not None and shard.bucket not in (None, bucket):
                continue
            for index, row in enumerate(self.rows(shard)):
                if row[0] == path:
                    yield shard, index

    def _shard(self, name: str, spec: str) -> ShardInfo:
        shards = self.manifest.shards
        if name.isdigit() and int(name) < len(shards):
            return shards[int(name)]
        for shard in shards:
            if shard.name == name:
                return shard
        raise InputError(
            f"{spec}: expected a shard name of version {self.manifest.fingerprint} "
            f"(e.g. {shards[0].name}) or a number below {len(shards)}, found {name!r}"
            if shards
            else f"{spec}: version {self.manifest.fingerprint} has no shards"
        )

    def _bytes(self, shard: ShardInfo, index: int) -> memoryview:
        """The data of record ``index``: one read through the index file, or an inflate."""
        path = storage.join(self.directory, shard.name)
        if shard.index_sha256 is not None and self.manifest.compression == "none":
            offset, size = self._index_line(shard, index)
            with self.fs.open(path, "rb") as f:
                f.seek(offset)
                buf = f.read(size)
            found = next(tfrecord.scan(buf), None)
        else:
            data = storage.read_bytes(self.fs, path)
            stream = b"".join(tfrecord.inflate(data, self.manifest.compression))
            found = next((r for r in tfrecord.scan(stream) if r.index == index), None)
        if found is None or found.problem is not None or found.data is None:
            why = found.problem if found is not None else "no record there"
            raise ShardError(f"{self._where(shard)}: record {index}: {why}")
        return found.data

    def _index_line(self, shard: ShardInfo, index: int) -> tuple[int, int]:
        """Offset and frame size of record ``index``, from the shard's index file."""
        path = storage.join(self.directory, layout.INDEX.path(shard.name))
        if shard.name not in self._offsets:
            self._offsets[shard.name] = storage.read_bytes(self.fs, path).split(b"\n")
        lines = self._offsets[shard.name]
        parts = lines[index].split() if index < len(lines) else []
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            where = storage.unstrip(self.fs, path)
            raise ShardError(f"{where}: line {index + 1}: expected 'offset size', found {parts!r}")
        return int(parts[0]), int(parts[1])

    def _where(self, shard: ShardInfo) -> str:
        return storage.unstrip(self.fs, storage.join(self.directory, shard.name))
