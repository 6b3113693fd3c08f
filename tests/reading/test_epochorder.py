"""An epoch's record order is a pure, seekable function of the shards, seed, epoch and worker."""

from __future__ import annotations

import numpy as np
import pytest

from tfshards.errors import ConfigError
from tfshards.reading.epochorder import EpochOrder, Position

RECORDS = [1000, 700, 0, 1234, 5, 999] + [600] * 10  # 16 shards, one empty
BYTES = [r * 2000 for r in RECORDS]  # 2 KB records: ~524 per 1 MB unit


def _order(**kw):  # type: ignore[no-untyped-def]
    args = {"seed": 3, "window_bytes": 4 << 20, **kw}
    return EpochOrder(RECORDS, BYTES, **args)


def _epoch(order: EpochOrder, epoch: int, record: int = 0) -> list[tuple[int, int]]:
    """(shard, record) of every record the worker reads in ``epoch`` from ``record`` on."""
    out: list[tuple[int, int]] = []
    for window, skip, take in order.slices(epoch, record).tolist():
        w = order.window(epoch, window)
        ids = [(s, f + i) for s, f, n in w.pieces.tolist() for i in range(n)]
        out += [ids[k] for k in w.perm[skip : skip + take]]
    return out


def test_one_worker_reads_every_record_once_per_epoch_in_a_new_order():
    order = _order()
    every = {(s, i) for s, n in enumerate(RECORDS) for i in range(n)}
    first, second = _epoch(order, 0), _epoch(order, 1)
    assert len(first) == len(second) == sum(RECORDS) and set(first) == set(second) == every
    assert first != second
    assert order.units > len(RECORDS)  # shards are cut into ~1 MB units
    assert len(order.slices(0)) > 1  # several windows


def test_the_order_is_a_pure_function_of_its_inputs():
    assert _epoch(_order(), 2) == _epoch(_order(), 2)
    assert _epoch(_order(), 2) != _epoch(_order(seed=4), 2)


@pytest.mark.parametrize("record", [0, 1, 523, 524, 2500, 7000, sum(RECORDS) - 1, sum(RECORDS)])
def test_a_position_reads_exactly_the_rest_of_the_epoch(record):
    order = _order()
    assert _epoch(order, 1, record) == _epoch(order, 1)[record:]


@pytest.mark.parametrize("count", [2, 3])
def test_workers_read_disjoint_equal_blocks_whose_union_is_the_epoch(count):
    total = sum(RECORDS)
    parts = [_epoch(_order(worker=(i, count)), 0) for i in range(count)]
    assert {len(p) for p in parts} == {total // count}
    union = [r for p in parts for r in p]
    assert len(set(union)) == len(union)  # disjoint
    whole = _epoch(_order(), 0)
    assert union == whole[: len(union)]  # blocks of the one global order
    assert _order(worker=(0, count)).dropped == total % count == total - len(union)


def test_compressed_shards_are_whole_units():
    order = _order(whole_shards=True)
    assert order.units == sum(1 for r in RECORDS if r)
    assert sorted(_epoch(order, 0)) == sorted(_epoch(_order(), 0))


def test_position_after_steps_rolls_over_epochs():
    assert Position.after(25, 10) == Position(2, 5)
    assert Position.after(0, 10) == Position(0, 0)
    with pytest.raises(ConfigError):
        Position(-1, 0)
    with pytest.raises(ConfigError):
        _order(worker=(2, 2))


def test_small_windows_keep_reads_bounded():
    order = _order(window_bytes=1)
    assert len(order.slices(0)) == order.units  # one unit per window
    sizes = [len(order.window(0, w).perm) for w in range(order.units)]
    assert max(sizes) <= 600 and np.sum(sizes) == sum(RECORDS)
