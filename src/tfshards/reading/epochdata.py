"""The training records in :class:`~tfshards.reading.epochorder.EpochOrder`: windows read whole.

A window's units are read through :func:`tfshards.reading.chunks.read_chunk`
(each layout chunk a unit touches read and checked once per window; a chunk
shared by units of two windows is read by both: an epoch of 20,000 32 px JPEGs,
26 MB in 16 shards, read 1.00x its bytes in one 32 MB window, 1.44x in 7 windows
of 4 MB, 1.52x in 25 of 1 MB; CPU next to decoding them is small), their
records permuted, and handed to tf.data as one string blob with record
offsets, which tf.data cuts apart with one ``substr``, as
:func:`tfshards.reading.chunks.records` does. One window is read while the
one before is consumed: about three windows are held at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tfshards.reading import chunks
from tfshards.reading.epochorder import EpochOrder, Position, Window
from tfshards.reading.gate import Gate
from tfshards.reading.options import ReadOptions
from tfshards.shardset.manifest import Manifest, ShardInfo

_FOREVER = 1 << 62  # epochs of an endless stream


def read_window(
    gate: Gate,
    paths: Sequence[str],
    order: EpochOrder,
    epoch: int,
    row: Sequence[int],
    *,
    last: int = _FOREVER,
) -> tuple[bytes, np.ndarray, np.ndarray]:
    """One row ``(window, skip, take)`` of :meth:`EpochOrder.slices`: the bytes read, and
    where each of the ``take`` records starts in them and how long it is, in order.

    Each shard of the window is opened (and, from a limited cache, pinned) once, and let
    go after its last chunk or at the window's end; the gate is told the shards this
    window and the next open, in order (a limited cache brings them ahead); epochs
    from ``last`` on are not read.
    """
    window, skip, take = (int(v) for v in row)
    chosen = order.window(epoch, window)
    gate.expect([paths[s] for s in upcoming(order, chosen, epoch, window, last)])
    blobs: list[bytes] = []
    held: dict[tuple[int, int], tuple[int, np.ndarray, np.ndarray, int]] = {}
    layouts: dict[int, np.ndarray] = {}
    pinned: set[int] = set()  # shards open (pinned in a limited cache) for this window
    offset = 0
    starts: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    try:
        for shard, first, count in chosen.pieces.tolist():
            path = paths[shard]
            rows = layouts.get(shard)
            if rows is None:
                rows = layouts[shard] = chunks.layout(gate, path)
                pinned.update([shard] if len(rows) else [])  # an empty one is let go at once
            lo = int(np.searchsorted(rows[:, 2], first, side="right")) - 1
            hi = int(np.searchsorted(rows[:, 2], first + count, side="left"))
            for r in range(lo, hi):
                key = (shard, r)
                if key not in held:
                    if shard not in pinned:  # its last chunk was read: open it again
                        chunks.layout(gate, path)
                        pinned.add(shard)
                    if r == len(rows) - 1:
                        pinned.discard(shard)  # read_chunk lets go after the last chunk
                    data, at, length = chunks.read_chunk(gate, path, rows[r].tolist())
                    held[key] = (offset, at, length, int(rows[r, 2]))
                    blobs.append(data)
                    offset += len(data)
                base, at, length, row_first = held[key]
                a = max(first, row_first) - row_first
                b = min(first + count, row_first + len(at)) - row_first
                starts.append(at[a:b] + base)
                lengths.append(length[a:b])
    finally:
        for shard in pinned:
            gate.done(paths[shard])
    begin = np.concatenate(starts) if starts else np.zeros(0, np.int64)
    size = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    picked = chosen.perm[skip : skip + take]
    return b"".join(blobs), begin[picked], size[picked]


def upcoming(
    order: EpochOrder, chosen: Window, epoch: int, window: int, last: int = _FOREVER
) -> list[int]:
    """The shards ``chosen`` (window ``window`` of ``epoch``) reads, in order, then those of
    this worker's next window (of this epoch, else of the next, if before ``last``)."""
    rows = order.slices(epoch)
    later = rows[rows[:, 0] > window, 0]
    after = order.slices(epoch + 1) if not len(later) and epoch + 1 < last else rows[:0]
    nxt = [order.window(epoch, int(later[0]))] if len(later) else []
    nxt += [order.window(epoch + 1, int(after[0, 0]))] if len(after) else []
    shards: list[int] = [int(s) for w in [chosen, *nxt] for s in w.pieces[:, 0]]
    return shards


def records(
    tf: Any,
    gate: Gate,
    paths: Sequence[str],
    order: EpochOrder,
    start: Position,
    *,
    repeat: bool,
) -> Any:
    """A ``tf.data.Dataset`` of serialized records: the rest of ``start``'s epoch, then
    (``repeat``) every following epoch."""
    last = _FOREVER if repeat else start.epoch + 1
    plain = tf.autograph.experimental.do_not_convert  # no tensor control flow to convert

    def slices(epoch: np.int64) -> np.ndarray:
        e = int(epoch)
        return order.slices(e, start.record if e == start.epoch else 0)

    def read(epoch: np.int64, row: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        data, begin, size = read_window(gate, paths, order, int(epoch), row.tolist(), last=last)
        return np.array(data, dtype=object), begin, size  # object: bytes kept whole

    def windows(epoch: Any) -> Any:
        rows = tf.numpy_function(slices, [epoch], tf.int64)
        rows.set_shape([None, 3])
        return tf.data.Dataset.from_tensor_slices(rows).map(plain(lambda row: (epoch, row)))

    def cut(epoch: Any, row: Any) -> Any:
        data, begin, size = tf.numpy_function(read, [epoch, row], (tf.string, tf.int64, tf.int64))
        data.set_shape([])
        begin.set_shape([None])
        size.set_shape([None])
        return tf.strings.substr(data, begin, size)

    epochs = tf.data.Dataset.range(start.epoch, last)
    return epochs.flat_map(plain(windows)).map(plain(cut)).prefetch(1).unbatch()


def epoch_order(
    shards: Sequence[ShardInfo], manifest: Manifest, read: ReadOptions, window_bytes: int
) -> EpochOrder:
    """The :class:`EpochOrder` of ``shards`` as ``read`` asks (seed, worker, window size)."""
    mean = max(1, manifest.bytes // max(1, manifest.records))
    if read.shuffle_buffer is not None:
        window_bytes = read.shuffle_buffer * mean
    return EpochOrder(
        [s.records for s in shards],
        [s.bytes for s in shards],
        seed=read.seed,
        window_bytes=window_bytes,
        whole_shards=manifest.compression != "none",
        worker=read.worker,
    )
