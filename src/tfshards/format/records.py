"""A shard's records, walked and parsed: by the C loops where built, else by the Python reference.

:func:`parse_records` finds what :func:`tfshards.format.tfrecord.scan` and
:func:`tfshards.format.exampleparser.outline` find; the C loops
(``scan_frames``, ``outline_examples``) do the work where
:mod:`tfshards.format.native` is built, and a record they refuse goes back to
the reference, which words every problem.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any, NamedTuple

import numpy as np

from tfshards.format import native, tfrecord, wire
from tfshards.format.exampleparser import DecodeError, Outline, outline
from tfshards.format.native import Native


class Parsed(NamedTuple):
    """One record of :func:`parse_records`.

    ``data`` is None after a framing problem (the last record); ``fields``
    (the features asked for) is None when ``problem`` says why the record
    cannot be read: its data CRC, or bytes that are no Example.
    """

    index: int  # type: ignore[assignment]  # shadows tuple.index on purpose: record number
    offset: int
    data: memoryview | None
    fields: dict[str, Outline] | None
    problem: str | None


BATCH_RECORDS = 1 << 14  # records parsed per C call: their fields' arrays stay a few MB


def parse_records(buf: bytes | memoryview, names: Collection[str]) -> Iterator[Parsed]:
    """The records of an uncompressed TFRecord buffer, each parsed for the features ``names``.

    Finds what :func:`tfshards.format.tfrecord.scan` and
    :func:`tfshards.format.exampleparser.outline` find, in record order; the C
    loops do the walking and parsing where built, and a record they refuse
    goes back to the reference for its words.
    """
    c = native.NATIVE
    if c is None:
        yield from _scanned(buf, 0, 0, names)
        return
    view = memoryview(buf)
    found, data_ok, end = c.scan_frames(buf)
    offsets = np.frombuffer(found, dtype=np.int64)
    nexts = np.append(offsets[1:], end)  # where each record's frame ends
    keys = tuple(sorted(name.encode() for name in names))
    for lo in range(0, len(offsets), BATCH_RECORDS):
        at, following = offsets[lo : lo + BATCH_RECORDS], nexts[lo : lo + BATCH_RECORDS]
        starts = at + wire.HEADER_BYTES
        stops = following - wire.FOOTER_BYTES
        yield from _batch(c, view, lo, at, starts, stops, data_ok[lo : lo + len(at)], keys, names)
    yield from _scanned(view[end:], len(offsets), end, names)  # a framing problem, if any


def _scanned(
    buf: bytes | memoryview, first: int, at: int, names: Collection[str]
) -> Iterator[Parsed]:
    """The reference's walk and parse of ``buf``, record ``first`` at byte ``at`` of the shard."""
    for index, offset, data, problem in tfrecord.scan(buf):
        if problem is not None:
            yield Parsed(first + index, at + offset, data, None, problem)
        else:
            yield _reference(first + index, at + offset, data, names)


def _reference(index: int, offset: int, data: Any, names: Collection[str]) -> Parsed:
    try:
        return Parsed(index, offset, data, outline(data, names), None)
    except (DecodeError, UnicodeDecodeError) as exc:
        return Parsed(index, offset, data, None, f"not a tf.train.Example: {exc}")


def _batch(
    c: Native,
    view: memoryview,
    lo: int,
    at: np.ndarray,
    starts: np.ndarray,
    stops: np.ndarray,
    data_ok: bytes,
    keys: tuple[bytes, ...],
    names: Collection[str],
) -> Iterator[Parsed]:
    """Records ``lo``, ``lo + 1``, ... at offsets ``at``, their data at ``starts:stops``."""
    ok, kinds, counts, firsts = c.outline_examples(view, starts, stops, keys)
    k = len(keys)
    kind = np.frombuffer(kinds, dtype=np.uint8).reshape(-1, k).tolist()
    count = np.frombuffer(counts, dtype=np.int64).reshape(-1, k).tolist()
    first = np.frombuffer(firsts, dtype=np.int64).reshape(-1, k, 2).tolist()
    text = [key.decode() for key in keys]
    spans = zip(at.tolist(), starts.tolist(), stops.tolist(), strict=True)
    for i, (offset, a, b) in enumerate(spans):
        data = view[a:b]
        if not data_ok[i]:  # the reference words it
            problem = next(tfrecord.scan(view[offset : b + wire.FOOTER_BYTES])).problem
            yield Parsed(lo + i, offset, data, None, problem)
        elif not ok[i]:
            yield _reference(lo + i, offset, data, names)
        else:
            fields = {}
            for name, t, n, (x, y) in zip(text, kind[i], count[i], first[i], strict=True):
                if t == _BYTES:
                    fields[name] = Outline("bytes", n, view[x:y] if n else None)
                elif t:
                    fields[name] = Outline(wire.DTYPE_OF_FIELD[t], n, x if y else None)
            yield Parsed(lo + i, offset, data, fields, None)


_BYTES = wire.KIND_FIELD["bytes"]  # a kind C reports; float: its first value is never kept (0, 0)
