"""Check the records of a decompressed shard: every record rule over every record, in order.

Where the C loops are built, a window's records are parsed once into columns
(:mod:`tfshards.validation.batch`), each rule's bulk clearance
(:mod:`tfshards.validation.clearance`) passes the records it surely passes,
and the rule itself runs only on the rest; labels and digests are kept in
bulk. Without them, each record goes through each rule (the reference).
Both find the same problems, in the same order. Extra columns that declare
bounds or a length multiple (:mod:`tfshards.format.columns`) are checked
after the rules, on either path, in each record the first rule passes: its
Example is decoded in Python (the C outline keeps no float values).
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable, Sequence

import numpy as np

from tfshards.errors import InputError
from tfshards.format import native, wire
from tfshards.format.columns import Column
from tfshards.format.exampleparser import named_values
from tfshards.format.records import Parsed, parse_records
from tfshards.format.schema import FeatureSpec
from tfshards.shardset.grouping import GroupBy
from tfshards.validation import rules
from tfshards.validation.batch import BYTES, INT64, Batch, parse_batch
from tfshards.validation.clearance import CLEARANCES

_INT32 = struct.Struct("=i")  # a record's label id, as numpy reads np.int32
_LENGTH = struct.Struct("<Q")  # a frame's data length, its first 8 bytes


def check_records(buf: bytes | memoryview, checker: RecordChecker) -> int:
    """Check every record of the decompressed shard ``buf``; returns how many the framing holds.

    The records are walked and parsed by :func:`tfshards.format.records.parse_records`
    (C where built, else the Python reference; both find the same fields and
    problems), then each goes through :data:`tfshards.validation.rules.RECORD_RULES`.
    Problems come in record order; offsets count in the decompressed stream.
    """
    c = native.NATIVE
    if c is not None:
        batch, refused = parse_batch(c, buf, checker.names)
        return checker.check_batch(batch, refused)
    records = 0
    for index, offset, data, fields, problem in parse_records(buf, checker.names):
        if data is None:  # a framing problem: nothing past it can be trusted
            checker.add(problem or "", index, offset)
            break
        records += 1
        if fields is None:  # a damaged record, or not an Example
            checker.add(problem or "", index, offset)
            continue
        checker.check(rules.Record(index, offset, fields), data)
    return records


class RecordChecker:
    """What to check in each record of one shard, and where its problems go.

    Args:
        schema: the features each record must hold, as the manifest lists them.
        image_feature: the feature holding the raw file bytes.
        num_labels: labels in the manifest; a ``label`` outside ``0..num_labels-1`` is a problem.
        check_sha: compare the stored ``sha256`` feature with the payload's (when both exist).
        decode_images: also decode each payload with TensorFlow (:func:`payload_decodes`).
        labels: records per label index (in range only), counted in place.
        add: called as ``add(what, record index, byte offset)`` for each problem found.
        digests: when given, record ``i``'s stored ``sha256`` (64 hex digits) is
            kept as 32 bytes at ``digests[32 * i : 32 * i + 32]`` (zeros where a
            record has none, or lies past the buffer's end).
        record_labels: when given, record ``i``'s label id is kept as a native
            int32 at ``record_labels[4 * i : 4 * i + 4]`` (in range only).
        group_by: when given, each record's ``path`` feature names its group,
            added to ``groups``; a path the pattern does not match is a problem.
        groups: the group keys found, added to in place.
        record_rules: the rules, in the order they run (the first gates the rest).
        columns: extra columns whose values are checked (bounds, a variable
            list's length multiple) in each record the first rule passes.
    """

    def __init__(
        self,
        schema: Sequence[FeatureSpec],
        image_feature: str,
        *,
        num_labels: int,
        check_sha: bool,
        decode_images: bool,
        labels: list[int],
        add: Callable[[str, int, int], None],
        digests: bytearray | None = None,
        record_labels: bytearray | None = None,
        group_by: GroupBy | None = None,
        groups: set[str] | None = None,
        record_rules: Sequence[rules.RecordRule] = rules.RECORD_RULES,
        columns: Sequence[Column] = (),
        bucket: tuple[int, int] | None = None,
    ) -> None:
        group_by = group_by if groups is not None else None
        self.shard = rules.Shard(
            tuple(schema), image_feature, num_labels, check_sha, decode_images, group_by, bucket
        )
        self.names = frozenset(spec.name for spec in schema)
        self.gate, *rest = record_rules
        self.rules = tuple(rest)
        self.labels, self.add = labels, add
        self.count_labels = self.shard.has_label
        self.digests = digests if self.shard.has_sha256 else None
        self.record_labels = record_labels
        self.groups: set[str] = groups if groups is not None else set()
        self.group_by = group_by if self.shard.has_path else None
        self.columns = tuple(
            c for c in columns if c.low is not None or c.high is not None or c.multiple != 1
        )
        self.names_valued = frozenset(c.name for c in self.columns)

    def check(self, record: rules.Record, data: bytes | memoryview | None = None) -> None:
        """Apply the rules to one record whose data CRC held; its column values, given ``data``."""
        for what in self.problems(record):
            self.add(what, record.index, record.offset)
        if data is not None and self.columns and self.gate(self.shard, record) is None:
            for what in self.value_problems(data):
                self.add(what, record.index, record.offset)

    def value_problems(self, data: bytes | memoryview) -> list[str]:
        """The extra columns' values in the Example ``data`` out of their bounds or length."""
        found = named_values(data, self.names_valued)
        out = []
        for column in self.columns:
            dtype, values = found.get(column.name, (column.dtype, []))
            if dtype != column.dtype and values:
                continue  # the schema rule reports it
            problem = column.length_problem(len(values)) or column.out_of_bounds(values)
            if problem is not None:
                out.append(f"feature {column.name!r}: {problem}")
        return out

    def problems(self, record: rules.Record) -> list[str]:
        """The problems of one record whose data CRC held, in rule order; keeps its label etc."""
        problem = self.gate(self.shard, record)
        if problem is not None:
            return [problem]
        if self.count_labels:
            label = record.first("label", -1)
            if 0 <= label < len(self.labels):
                self.labels[label] += 1
                kept = self.record_labels
                if kept is not None and 4 * record.index + 4 <= len(kept):
                    _INT32.pack_into(kept, 4 * record.index, label)
        if self.digests is not None:
            self.keep_digest(record.index, record.first("sha256", b""))
        self._add_group(record)
        found = (rule(self.shard, record) for rule in self.rules)
        return [problem for problem in found if problem is not None]

    def check_batch(self, batch: Batch, refused: Sequence[Parsed]) -> int:
        """Apply the rules to a window's records in bulk; how many records the framing holds.

        ``refused``: the records the C loops did not read, as the reference
        words them, and the framing problem, if any, last.
        """
        found: list[tuple[int, int, int, str]] = []  # (record, rule, offset, what)
        records = len(batch)
        for parsed in refused:
            if parsed.data is not None:
                records += 1
            if parsed.fields is None:
                found.append((parsed.index, -1, parsed.offset, parsed.problem or ""))
            else:  # the reference reads what C refused: checked record by record
                record = rules.Record(parsed.index, parsed.offset, parsed.fields)
                found += [(record.index, 0, record.offset, p) for p in self.problems(record)]
                if (
                    self.columns
                    and parsed.data is not None
                    and self.gate(self.shard, record) is None
                ):
                    off = self.value_problems(parsed.data)
                    found += [(record.index, 0, record.offset, p) for p in off]
        passed = self._gate(batch, found)
        self._keep(passed)
        for rank, rule in enumerate(self.rules, 1):
            clear = CLEARANCES.get(rule)
            rows = (
                np.arange(len(passed))
                if clear is None
                else np.flatnonzero(~clear(self.shard, passed))
            )
            for row in rows.tolist():
                record = passed.record(row)
                problem = rule(self.shard, record)
                if problem is not None:
                    found.append((record.index, rank, record.offset, problem))
        if self.columns:
            found += self._batch_values(passed, len(self.rules) + 1)
        found.sort(key=lambda p: (p[0], p[1]))
        for index, _, offset, what in found:
            self.add(what, index, offset)
        return records

    def _batch_values(self, batch: Batch, rank: int) -> list[tuple[int, int, int, str]]:
        """:meth:`value_problems` of each row of ``batch`` (its frame read from the view)."""
        found = []
        for index, offset in zip(batch.index.tolist(), batch.offset.tolist(), strict=True):
            (length,) = _LENGTH.unpack_from(batch.view, offset)
            start = offset + wire.HEADER_BYTES
            what = self.value_problems(batch.view[start : start + length])
            found += [(index, rank, offset, p) for p in what]
        return found

    def _gate(self, batch: Batch, found: list[tuple[int, int, int, str]]) -> Batch:
        """The rows the first rule passes; the problems of the others go to ``found``."""
        clear = CLEARANCES.get(self.gate)
        suspects = (
            np.arange(len(batch)) if clear is None else np.flatnonzero(~clear(self.shard, batch))
        )
        failed = np.zeros(len(batch), dtype=bool)
        for row in suspects.tolist():
            record = batch.record(row)
            problem = self.gate(self.shard, record)
            if problem is not None:
                failed[row] = True
                found.append((record.index, 0, record.offset, problem))
        return batch.rows(~failed) if failed.any() else batch

    def _keep(self, batch: Batch) -> None:
        """What :meth:`check` keeps of each record, for the rows of ``batch`` (gate passed)."""
        index = batch.index
        if self.count_labels:
            label = np.where(
                batch.scalar("label", INT64), batch.first[:, batch.column("label"), 0], -1
            )
            counted = (label >= 0) & (label < len(self.labels))
            for value, n in enumerate(
                np.bincount(label[counted], minlength=len(self.labels)).tolist()
            ):
                self.labels[value] += n
            if self.record_labels is not None:
                kept = np.frombuffer(self.record_labels, dtype=np.int32)
                room = counted & (index < len(kept))
                kept[index[room]] = label[room]
        if self.digests is not None:
            self._keep_digests(batch)
        if self.group_by is not None:
            for row in range(len(batch)):
                self._add_group(batch.record(row))

    def _keep_digests(self, batch: Batch) -> None:
        """:meth:`keep_digest` over the rows of ``batch``, in bulk."""
        kept = np.frombuffer(self.digests or bytearray(), dtype=np.uint8).reshape(-1, 32)
        start, stop = batch.spans("sha256")
        hexed = batch.heads("sha256", 64)
        nibbles = _NIBBLE[hexed]
        room = batch.scalar("sha256", BYTES) & (stop - start == 64) & (batch.index < len(kept))
        room &= (nibbles < 16).all(axis=1)
        rows = np.flatnonzero(room)
        kept[batch.index[rows]] = (nibbles[rows, 0::2] << 4) | nibbles[rows, 1::2]

    def _add_group(self, record: rules.Record) -> None:
        """Add ``record``'s group (by its ``path``), if the pattern names one."""
        if self.group_by is None:
            return
        path = bytes(record.first("path", b"")).decode("utf-8", "replace")
        try:
            key = self.group_by.key(path)
        except InputError:  # a match past its time limit: the group rule reports it
            key = None
        if key is not None:  # none: the group rule reports it
            self.groups.add(key)

    def keep_digest(self, index: int, stored: bytes | memoryview) -> None:
        """Keep record ``index``'s stored sha256 (hex) as 32 bytes, if it is one."""
        end = 32 * index + 32
        if self.digests is None or end > len(self.digests) or len(stored) != 64:
            return
        with contextlib.suppress(ValueError):  # not hex: the sha256 rule reports it
            digest = bytes.fromhex(bytes(stored).decode("ascii"))
            if len(digest) == 32:  # fromhex skips spaces: "ab cd ..." is no digest either
                self.digests[end - 32 : end] = digest


# A hex digit's value by its byte (either case, as bytes.fromhex reads them); 16: not a digit.
_NIBBLE = np.full(256, 16, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _NIBBLE[_c] = _NIBBLE[bytes([_c]).upper()[0]] = _i
