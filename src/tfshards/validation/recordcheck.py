"""Check the records of a decompressed shard: every record rule over every record, in order."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable, Sequence

from tfshards.errors import InputError
from tfshards.format.records import parse_records
from tfshards.format.schema import FeatureSpec
from tfshards.shardset.grouping import GroupBy
from tfshards.validation import rules

_INT32 = struct.Struct("=i")  # a record's label id, as numpy reads np.int32


def check_records(buf: bytes | memoryview, checker: RecordChecker) -> int:
    """Check every record of the decompressed shard ``buf``; returns how many the framing holds.

    The records are walked and parsed by :func:`tfshards.format.records.parse_records`
    (C where built, else the Python reference; both find the same fields and
    problems), then each goes through :data:`tfshards.validation.rules.RECORD_RULES`.
    Problems come in record order; offsets count in the decompressed stream.
    """
    records = 0
    for index, offset, data, fields, problem in parse_records(buf, checker.names):
        if data is None:  # a framing problem: nothing past it can be trusted
            checker.add(problem or "", index, offset)
            break
        records += 1
        if fields is None:  # a damaged record, or not an Example
            checker.add(problem or "", index, offset)
            continue
        checker.check(rules.Record(index, offset, fields))
    return records


class RecordChecker:
    """What to check in each record of one shard, and where its problems go.

    Args:
        schema: the features each record must hold, as the manifest lists them.
        image_feature: the feature holding the raw file bytes.
        num_labels: labels in the manifest; a ``label`` outside ``0..num_labels-1`` is a problem.
        check_sha: compare the stored ``sha256`` feature with the payload's (when both exist).
        decode_images: also decode each payload with Pillow.
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
    ) -> None:
        group_by = group_by if groups is not None else None
        self.shard = rules.Shard(
            tuple(schema), image_feature, num_labels, check_sha, decode_images, group_by
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

    def check(self, record: rules.Record) -> None:
        """Apply the rules to one record whose data CRC held."""
        problem = self.gate(self.shard, record)
        if problem is not None:
            self.add(problem, record.index, record.offset)
            return
        if self.count_labels:
            label = record.first("label", -1)
            if 0 <= label < len(self.labels):
                self.labels[label] += 1
                kept = self.record_labels
                if kept is not None and 4 * record.index + 4 <= len(kept):
                    _INT32.pack_into(kept, 4 * record.index, label)
        if self.digests is not None:
            self.keep_digest(record.index, record.first("sha256", b""))
        if self.group_by is not None:
            path = bytes(record.first("path", b"")).decode("utf-8", "replace")
            try:
                key = self.group_by.key(path)
            except InputError:  # a match past its time limit: the group rule reports it
                key = None
            if key is not None:  # none: the group rule reports it
                self.groups.add(key)
        for rule in self.rules:
            problem = rule(self.shard, record)
            if problem is not None:
                self.add(problem, record.index, record.offset)

    def keep_digest(self, index: int, stored: bytes | memoryview) -> None:
        """Keep record ``index``'s stored sha256 (hex) as 32 bytes, if it is one."""
        end = 32 * index + 32
        if self.digests is None or end > len(self.digests) or len(stored) != 64:
            return
        with contextlib.suppress(ValueError):  # not hex: the sha256 rule reports it
            self.digests[end - 32 : end] = bytes.fromhex(bytes(stored).decode("ascii"))
