"""A window's records as columns: what the C outline parsed, one row a record, for bulk rules.

:func:`parse_batch` walks and parses a decompressed window with the C loops
(``scan_frames``, ``outline_examples``) once, and keeps each record's fields
as arrays (kind, count, first value) instead of a dict per record; a record
the C loops refuse (a data CRC that fails, bytes that are no Example) and a
framing problem are handed to :func:`tfshards.format.records.parse_records`
on that record alone, so the reference words them. :class:`Batch` builds the
:class:`~tfshards.validation.rules.Record` of one row only when a rule must
look at it record by record.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tfshards.format import wire
from tfshards.format.exampleparser import Outline
from tfshards.format.native import Native
from tfshards.format.records import Parsed, parse_records
from tfshards.validation import rules

BYTES, INT64 = wire.KIND_FIELD["bytes"], wire.KIND_FIELD["int64"]


@dataclass(frozen=True)
class Batch:
    """Records ``index`` (at byte ``offset``) of one window, each parsed for the features ``names``.

    Row ``i``, feature ``names[k]``: ``kind[i, k]`` (:data:`tfshards.format.wire.KIND_FIELD`,
    0: absent), ``count[i, k]`` values, and ``first[i, k]``: a bytes feature's first
    value's span in ``view``, or an int64 feature's first value and 1 (zeros: none).
    """

    view: memoryview
    names: tuple[str, ...]
    index: np.ndarray  # int64, record numbers in the shard
    offset: np.ndarray  # int64, byte offsets in the window's stream
    kind: np.ndarray  # uint8 (n, k)
    count: np.ndarray  # int64 (n, k)
    first: np.ndarray  # int64 (n, k, 2)
    held: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)  # heads read

    def __len__(self) -> int:
        return len(self.index)

    def column(self, name: str) -> int:
        return self.names.index(name)

    def scalar(self, name: str, kind: int) -> np.ndarray:
        """Rows where ``name`` holds one value of ``kind`` (what ``Record.first`` reads)."""
        k = self.column(name)
        one: np.ndarray = (self.kind[:, k] == kind) & (self.count[:, k] == 1)
        return one

    def spans(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Each row's first bytes value of ``name``, as (start, stop) in ``view``."""
        k = self.column(name)
        is_bytes = self.kind[:, k] == BYTES
        return np.where(is_bytes, self.first[:, k, 0], 0), np.where(
            is_bytes, self.first[:, k, 1], 0
        )

    def heads(self, name: str, size: int) -> np.ndarray:
        """Each row's first ``size`` bytes of ``name``'s first value, zero-padded: (n, size).

        Kept: the sha256 rule and the digests kept for duplicates read the same heads.
        """
        key = (name, size)
        if key not in self.held:
            self.held[key] = self._heads(name, size)
        return self.held[key]

    def _heads(self, name: str, size: int) -> np.ndarray:
        start, stop = self.spans(name)
        data = np.frombuffer(self.view, dtype=np.uint8)
        if len(data) < size:
            data = np.concatenate([data, np.zeros(size, dtype=np.uint8)])
        last = len(data) - size  # a window starting past it would run off the end
        out: np.ndarray = sliding_window_view(data, size)[
            np.minimum(start, last)
        ]  # rows copied, no indexes
        for row in np.flatnonzero(start > last).tolist():  # a short value at the very end
            out[row] = 0
            out[row, : len(data) - start[row]] = data[start[row] :]
        out[np.arange(size) >= (stop - start)[:, None]] = 0
        return out

    def rows(self, rows: np.ndarray) -> Batch:
        """The batch of ``rows`` only (a bool mask or row numbers)."""
        return Batch(
            self.view,
            self.names,
            self.index[rows],
            self.offset[rows],
            self.kind[rows],
            self.count[rows],
            self.first[rows],
        )

    def record(self, row: int) -> rules.Record:
        """Row ``row`` as the per-record rules see it (the fields the reference finds)."""
        fields = {}
        kinds, counts = self.kind[row].tolist(), self.count[row].tolist()
        firsts = self.first[row].tolist()  # one list per row: 5x faster than an int() per cell
        for name, t, n, (x, y) in zip(self.names, kinds, counts, firsts, strict=True):
            if t == BYTES:
                fields[name] = Outline("bytes", n, self.view[x:y] if n else None)
            elif t:
                fields[name] = Outline(wire.DTYPE_OF_FIELD[t], n, x if y else None)
        return rules.Record(int(self.index[row]), int(self.offset[row]), fields)


def parse_batch(
    c: Native, buf: bytes | memoryview, names: Collection[str]
) -> tuple[Batch, list[Parsed]]:
    """The records of ``buf`` the C loops read, and those they refuse (or the framing problem).

    The refused come as :func:`~tfshards.format.records.parse_records` words
    them, in record order; the framing problem, if any, last.
    """
    view = memoryview(buf)
    found, data_ok, end = c.scan_frames(buf)
    offsets = np.frombuffer(found, dtype=np.int64)
    nexts = np.append(offsets[1:], end)[: len(offsets)]  # where each frame ends
    keys = tuple(sorted(name.encode() for name in names))
    starts = offsets + wire.HEADER_BYTES
    stops = nexts - wire.FOOTER_BYTES
    ok, kinds, counts, firsts = c.outline_examples(view, starts, stops, keys)
    k = len(keys)
    good = np.frombuffer(ok, dtype=np.uint8).astype(bool)
    good &= np.frombuffer(data_ok, dtype=np.uint8).astype(bool)
    rows = np.flatnonzero(good)
    batch = Batch(
        view,
        tuple(key.decode() for key in keys),
        rows.astype(np.int64),
        offsets[rows],
        np.frombuffer(kinds, dtype=np.uint8).reshape(-1, k)[rows],
        np.frombuffer(counts, dtype=np.int64).reshape(-1, k)[rows],
        np.frombuffer(firsts, dtype=np.int64).reshape(-1, k, 2)[rows],
    )
    refused = [
        _alone(view, int(i), int(offsets[i]), int(nexts[i]), names)
        for i in np.flatnonzero(~good).tolist()
    ]
    refused += [p._replace(index=p.index + len(offsets)) for p in _tail(view, end, names)]
    return batch, refused


def _alone(view: memoryview, index: int, offset: int, stop: int, names: Collection[str]) -> Parsed:
    """Record ``index`` (its frame at ``offset:stop``) as the reference words it."""
    parsed = next(parse_records(view[offset:stop], names))
    return parsed._replace(index=index, offset=offset)


def _tail(view: memoryview, end: int, names: Collection[str]) -> Iterator[Parsed]:
    """Whatever follows the last whole record: the framing problem, if any."""
    for parsed in parse_records(view[end:], names):
        yield parsed._replace(offset=parsed.offset + end)
