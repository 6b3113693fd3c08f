"""Find records with byte-identical payloads (by stored sha256), in a set and across a split.

Digests arrive shard by shard (:meth:`DigestStore.add`) and are never held as
Python objects: equal digests are tallied as they come (80 bytes a distinct
payload), a set of up to ``SPILL_RECORDS`` records keeps the tallies in
memory, a larger one spills them to up to 256 temporary files split by their
leading bits, and the search reads one file at a time, so memory stays flat
however many records the set holds, and however many of them repeat one
payload (a million distinct records: 32 files of ~2.6 MB on disk)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import tempfile
import zlib
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfshards import storage
from tfshards.format import tfrecord
from tfshards.format.exampleparser import DecodeError, decode
from tfshards.format.wire import FOOTER_BYTES, HEADER_BYTES

EXAMPLES = 10  # duplicate pairs kept for the report: enough to see a pattern
SPILL_RECORDS = 1 << 16  # past this many records (2.6 MB of rows) digests go to disk
BUCKET_RECORDS = 1 << 15  # records aimed at per spill file: ~1.3 MB read back at a time
MAX_BUCKET_BITS = 8
ADD_RECORDS = (
    1 << 13
)  # records sorted into spill files at a time  # at most 256 spill files open at once
# A payload's tally: its digest, records, records in validation shards, the first two
# records and the first on each side of the split (each as shard << 32 | record), the
# smallest and largest label id its records carry (a label conflict when they differ), and
# the first record carrying each of those two (the pair a conflict names).
_FIELDS = (
    "count", "val", "first", "second", "first_train", "first_val", "label_min", "label_max",
    "at_min", "at_max",
)  # fmt: skip
_ROW = np.dtype([("key", np.uint64, (4,))] + [(name, np.int64) for name in _FIELDS])
_NONE = np.iinfo(np.int64).max  # no such record


@dataclass(frozen=True)
class Duplicate:
    """Two records holding the same payload: ``(shard, record index)`` each."""

    sha256: str
    first: tuple[str, int]
    second: tuple[str, int]
    across_splits: bool  # one record is in training, the other in validation
    paths: tuple[str, str] = ("", "")  # their ``path`` features, when read
    # A label conflict: two label ids the payload's records carry (smallest, largest).
    conflict: tuple[int, int] | None = None
    label_names: tuple[str, str] = ("", "")  # the conflict's labels by name, when known

    @property
    def what(self) -> str:
        """The pair, said from the first record's shard (which :meth:`__str__` puts first)."""
        i, (b, j) = self.first[1], self.second
        p, q = (f" ({path})" if path else "" for path in self.paths)
        where = "in training and validation" if self.across_splits else "in one split"
        digest = self.sha256[:16]
        said = f"record {i}{p}: same payload (sha256 {digest}...) as {b}: record {j}{q}, {where}"
        if self.conflict is None:
            return said
        a, z = (
            (repr(n) for n in self.label_names)
            if all(self.label_names)
            else (f"id {n}" for n in self.conflict)
        )
        return f"label conflict: {said}, labelled both {a} and {z}"

    def __str__(self) -> str:
        return f"{self.first[0]}: {self.what}"


@dataclass(frozen=True)
class Duplicates:
    """What :func:`find_duplicates` found.

    Attributes:
        records: records whose payload an earlier record already holds
            (records minus distinct payloads).
        groups: distinct payloads held by more than one record.
        across_splits: of those, payloads held by records on both sides of the split.
        label_conflicts: of those, payloads whose records carry different labels
            (the same image labelled twice: worse than a duplicate).
        examples: up to ``EXAMPLES`` pairs: label conflicts first, then those
            across the split.
    """

    records: int = 0
    groups: int = 0
    across_splits: int = 0
    label_conflicts: int = 0
    examples: tuple[Duplicate, ...] = ()

    def metrics(self) -> dict[str, int]:
        return {
            "across_splits": self.across_splits,
            "groups": self.groups,
            "label_conflicts": self.label_conflicts,
            "records": self.records,
        }


def find_duplicates(
    names: Sequence[str],
    digests: Sequence[bytes],
    val: Collection[str] = (),
    *,
    labels: Sequence[bytes] = (),
    limit: int = EXAMPLES,
) -> Duplicates:
    """Records of shards ``names`` whose 32-byte digests (``digests[k]`` of shard k) are equal.

    Record ``i`` of shard ``k`` has digest ``digests[k][32 * i : 32 * i + 32]``;
    an all-zero digest means none was read and matches nothing. Shards named
    in ``val`` are the validation side of the split, the others training.
    ``labels[k]`` holds shard k's label ids as int32 (see :meth:`DigestStore.add`).
    """
    with DigestStore(names, val, sum(len(d) // 32 for d in digests)) as store:
        for k, shard in enumerate(digests):
            store.add(k, shard, labels[k] if k < len(labels) else b"")
        return store.find(limit=limit)


class DigestStore:
    """The digests of a shard set, added shard by shard, then searched once (:meth:`find`).

    Equal digests are tallied as they come (how many records, how many in
    validation shards, the first two records, the first on each side), so a
    payload repeated a million times takes one row per ``ADD_RECORDS``
    records, not a million.

    Args:
        names: the shards, in order: shard ``k`` is ``names[k]``.
        val: names of the validation shards (the others are training).
        records: about how many records the set holds (the manifest's count):
            it decides whether the tallies stay in memory, and how many spill
            files share them.
        spill_records: more records than this go to disk.
        bucket_records: records aimed at per spill file.
        folder: where the spill files go (None: the system's temp folder);
            local scratch space, deleted by :meth:`close`.
    """

    def __init__(
        self,
        names: Sequence[str],
        val: Collection[str],
        records: int,
        *,
        spill_records: int = SPILL_RECORDS,
        bucket_records: int = BUCKET_RECORDS,
        folder: str | None = None,
    ) -> None:
        self.names = tuple(names)
        self._val = frozenset(k for k, n in enumerate(self.names) if n in val)
        self.spill_records, self.bucket_records, self.folder = spill_records, bucket_records, folder
        self.bits = self._bits(records) if records > spill_records else 0
        self._held: list[np.ndarray] = []
        self._count = 0
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._files: dict[int, Any] = {}

    def _bits(self, records: int) -> int:
        """Leading bits picking a row's spill file: ``2**bits`` files of ~``bucket_records``."""
        files = max(2, -(-records // max(self.bucket_records, 1)))
        return min(MAX_BUCKET_BITS, (files - 1).bit_length())

    def __enter__(self) -> DigestStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Delete the spill files."""
        for f in self._files.values():
            f.close()
        self._files.clear()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
        self._held.clear()

    def add(self, shard: int, digests: bytes, labels: bytes = b"") -> None:
        """Shard number ``shard``'s digests: record ``i``'s at ``[32 * i : 32 * i + 32]``.

        ``labels``: record ``i``'s label id as an int32 at ``[4 * i : 4 * i + 4]``
        (-1, or past the end: none read), for label conflicts.
        """
        whole = len(digests) - len(digests) % 32
        keys = np.frombuffer(digests, dtype=np.uint64, count=whole // 8).reshape(-1, 4)
        ids = np.full(len(keys), -1, dtype=np.int64)
        known = np.frombuffer(labels, dtype=np.int32, count=min(len(labels) // 4, len(keys)))
        ids[: len(known)] = known
        for lo in range(0, len(keys), ADD_RECORDS):  # temporaries stay small
            self._add(shard, lo, keys[lo : lo + ADD_RECORDS], ids[lo : lo + ADD_RECORDS])

    def _add(self, shard: int, first: int, keys: np.ndarray, ids: np.ndarray) -> None:
        present = np.flatnonzero(keys.any(axis=1))  # zeros: no digest was read
        rows = np.empty(len(present), dtype=_ROW)
        rows["key"] = keys[present]
        label = ids[present]
        rows["label_min"] = np.where(label >= 0, label, _NONE)
        rows["label_max"] = label
        where = (shard << 32) | (first + present)
        in_val = shard in self._val
        rows["count"] = 1
        rows["val"] = int(in_val)
        rows["first"] = where
        rows["second"] = _NONE
        rows["first_train"] = _NONE if in_val else where
        rows["first_val"] = where if in_val else _NONE
        rows["at_min"] = rows["at_max"] = np.where(label >= 0, where, _NONE)
        rows = _tally(rows)
        self._count += len(rows)
        if not self.bits and self._count > self.spill_records:  # more than the count said
            self.bits = self._bits(2 * self._count)
            held, self._held = self._held, []
            for part in held:
                self._spill(part)
        if self.bits:
            self._spill(rows)
        else:
            self._held.append(rows)

    def _spill(self, rows: np.ndarray) -> None:
        """Append ``rows`` to the spill file of their leading bits."""
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="tfshards-digests-", dir=self.folder)
        bucket = (rows["key"][:, 0] >> np.uint64(64 - self.bits)).astype(np.intp)
        order = np.argsort(bucket, kind="stable")
        rows, bucket = rows[order], bucket[order]
        bounds = np.searchsorted(bucket, np.arange((1 << self.bits) + 1)).tolist()
        for b in np.flatnonzero(np.diff(bounds)).tolist():
            if b not in self._files:
                # Local scratch space, not a data location: plain files.
                path = os.path.join(self._dir.name, f"{b:03d}")
                self._files[b] = open(path, "wb")  # noqa: SIM115 - closed by close()
            self._files[b].write(rows[bounds[b] : bounds[b + 1]].tobytes())

    def _buckets(self) -> Iterator[np.ndarray]:
        """The tallies, one spill file at a time, in the order of their leading bits."""
        if not self.bits:
            yield np.concatenate(self._held) if self._held else np.empty(0, dtype=_ROW)
            return
        for b in sorted(self._files):
            f = self._files[b]
            f.flush()
            yield np.fromfile(f.name, dtype=_ROW)

    def find(self, *, limit: int = EXAMPLES) -> Duplicates:
        """The duplicates among what was added.

        Payloads are taken in digest order and records in (shard, record)
        order, so the result does not depend on the order shards were added in.
        """
        records = groups = across_splits = conflicts = 0
        shown: tuple[list[Duplicate], list[Duplicate], list[Duplicate]] = ([], [], [])
        for rows in self._buckets():
            t = _tally(rows)
            repeated = t["count"] > 1
            crossing = repeated & (t["val"] > 0) & (t["val"] < t["count"])
            conflicting = repeated & (t["label_max"] >= 0) & (t["label_min"] < t["label_max"])
            records += int(t["count"][repeated].sum() - repeated.sum())
            groups += int(repeated.sum())
            across_splits += int(crossing.sum())
            conflicts += int(conflicting.sum())
            kinds = (conflicting, crossing & ~conflicting, repeated & ~crossing & ~conflicting)
            for kept, kind in zip(shown, kinds, strict=True):
                for row in t[kind][: limit - len(kept)]:
                    kept.append(self._example(row))
        examples = tuple((shown[0] + shown[1] + shown[2])[:limit])
        return Duplicates(records, groups, across_splits, conflicts, examples)

    def _example(self, row: np.ndarray) -> Duplicate:
        """The pair to show for one tally: across the split if it is, else its first two."""
        crossing = 0 < int(row["val"]) < int(row["count"])
        if crossing:
            first, second = sorted((int(row["first_train"]), int(row["first_val"])))
        else:
            first, second = int(row["first"]), int(row["second"])
        low, high = int(row["label_min"]), int(row["label_max"])
        conflict = (low, high) if 0 <= low < high else None
        if conflict is not None:  # the two records of the two labels, whatever else held it
            first, second = sorted((int(row["at_min"]), int(row["at_max"])))
            crossing = ((first >> 32) in self._val) != ((second >> 32) in self._val)

        def where(w: int) -> tuple[str, int]:
            return self.names[w >> 32], w & 0xFFFFFFFF

        digest = row["key"].tobytes().hex()
        return Duplicate(digest, where(first), where(second), crossing, conflict=conflict)


def _tally(rows: np.ndarray) -> np.ndarray:
    """One row per distinct key, in key order: counts summed, the first records kept."""
    if not len(rows):
        return rows
    keys = rows["key"]
    order = np.lexsort((rows["first"], keys[:, 3], keys[:, 2], keys[:, 1], keys[:, 0]))
    rows = rows[order]
    keys = rows["key"]
    start = np.ones(len(rows), dtype=bool)
    start[1:] = (keys[1:] != keys[:-1]).any(axis=1)
    at = np.flatnonzero(start)
    out = rows[at]  # a copy: the key, and the group's smallest first record
    out["count"] = np.add.reduceat(rows["count"], at)
    out["val"] = np.add.reduceat(rows["val"], at)
    # The group's second record: the first row's own second, or another row's first.
    second = np.where(start, rows["second"], np.minimum(rows["first"], rows["second"]))
    out["second"] = np.minimum.reduceat(second, at)
    out["first_train"] = np.minimum.reduceat(rows["first_train"], at)
    out["first_val"] = np.minimum.reduceat(rows["first_val"], at)
    out["label_min"] = np.minimum.reduceat(rows["label_min"], at)
    out["label_max"] = np.maximum.reduceat(rows["label_max"], at)
    group = np.cumsum(start) - 1  # each row's group, to compare with the group's min and max
    for end, at_end in (("label_min", "at_min"), ("label_max", "at_max")):
        holds = rows[end] == out[end][group]
        out[at_end] = np.minimum.reduceat(np.where(holds, rows[at_end], _NONE), at)
    return out


def with_paths(
    found: Duplicates,
    url: str,
    compression: str,
    readable: Collection[str],
    storage_options: Mapping[str, Any] | None = None,
) -> Duplicates:
    """``found`` with each example's records named by their ``path`` feature.

    Reads the shards (under version directory ``url``) that the examples name,
    one at a time, in pieces, up to the last record wanted, and only those in
    ``readable`` (shards whose size and bytes matched their manifest entry); a
    record it cannot read keeps its shard and index alone.
    """
    wanted = {where for d in found.examples for where in (d.first, d.second)}
    paths: dict[tuple[str, int], str] = {}
    fs, root = storage.open_url(url, **(storage_options or {}))
    for name in sorted({shard for shard, _ in wanted} & set(readable)):
        last = max(i for shard, i in wanted if shard == name)
        try:
            with fs.open(storage.join(root, name), "rb") as f:
                for i, data in enumerate(_records(f, compression)):
                    if (name, i) in wanted:
                        with contextlib.suppress(
                            DecodeError, KeyError, IndexError, UnicodeDecodeError
                        ):
                            paths[name, i] = bytes(decode(data)["path"][1][0]).decode()
                    if i >= last:
                        break
        except (OSError, zlib.error):
            continue
    examples = tuple(
        dataclasses.replace(d, paths=(paths.get(d.first, ""), paths.get(d.second, "")))
        for d in found.examples
    )
    return dataclasses.replace(found, examples=examples)


def with_label_names(found: Duplicates, labels: Sequence[str]) -> Duplicates:
    """``found`` with each label conflict's ids named (ids outside ``labels`` stay ids)."""

    def named(d: Duplicate) -> Duplicate:
        if d.conflict is None or not all(0 <= i < len(labels) for i in d.conflict):
            return d
        return dataclasses.replace(d, label_names=(labels[d.conflict[0]], labels[d.conflict[1]]))

    return dataclasses.replace(found, examples=tuple(named(d) for d in found.examples))


READ_CHUNK = 1 << 20  # shard bytes read at a time when looking up paths


def _records(f: Any, compression: str) -> Iterator[bytes]:
    """The records of an open shard, read in pieces; stops where the framing does not hold."""
    pieces: Iterator[bytes] = iter(functools.partial(f.read, READ_CHUNK), b"")
    if compression != "none":
        pieces = tfrecord.inflate(pieces, compression)
    buf, pos = bytearray(), 0
    for piece in pieces:
        del buf[:pos]
        buf += piece
        pos = 0
        while len(buf) - pos >= HEADER_BYTES:
            length, problem = tfrecord.read_header(buf[pos : pos + HEADER_BYTES])
            if problem is not None:
                return
            start = pos + HEADER_BYTES
            if start + length + FOOTER_BYTES > len(buf):
                break
            yield bytes(buf[start : start + length])
            pos = start + length + FOOTER_BYTES
