"""The input stall: waits for data timed per step, one step in flight."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tfshards.training.stall import LoopTiming, timed_loop


@dataclass
class FakeClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


def _batches(clock: FakeClock, n: int, load_s: float) -> Iterator[list[int]]:
    for i in range(n):
        clock.now += load_s
        yield [i] * 4


def test_waits_for_data_are_the_input_bound_fraction() -> None:
    clock = FakeClock()

    def step(batch: list[int]) -> int:
        clock.now += 1.0
        return batch[0]

    timing = timed_loop(_batches(clock, 10, 3.0), 10, step, count=len, clock=clock)
    assert timing == LoopTiming(steps=10, examples=40, wait_s=30.0, total_s=40.0)
    assert timing.input_bound_fraction == 0.75
    assert timing.examples_per_s == 1.0


def test_one_step_stays_in_flight_and_every_step_is_synced() -> None:
    calls: list[str] = []

    def step(batch: list[int]) -> int:
        calls.append(f"step {batch[0]}")
        return batch[0]

    timed_loop(iter([[0], [1], [2]]), 3, step, count=len, sync=lambda r: calls.append(f"sync {r}"))
    assert calls == ["step 0", "step 1", "sync 0", "step 2", "sync 1", "sync 2"]


def test_loop_stops_when_the_data_runs_out() -> None:
    timing = timed_loop(iter([[1, 2], [3]]), 10, lambda b: None, count=len)
    assert (timing.steps, timing.examples) == (2, 3)


def test_real_slow_loader_reads_near_1_and_real_slow_model_near_0() -> None:
    def slow_loader() -> Iterator[int]:
        for i in range(5):
            time.sleep(0.02)
            yield i

    loader_bound = timed_loop(slow_loader(), 5, lambda b: None, count=lambda b: 1)
    model_bound = timed_loop(iter(range(5)), 5, lambda b: time.sleep(0.02), count=lambda b: 1)
    assert 0.8 < loader_bound.input_bound_fraction <= 1.0
    assert 0.0 <= model_bound.input_bound_fraction < 0.2


@pytest.mark.parametrize(("wait", "total"), [(0.0, 0.0), (2.0, 1.0), (0.0, 5.0)])
def test_input_bound_fraction_is_always_in_0_1(wait: float, total: float) -> None:
    assert 0.0 <= LoopTiming(1, 1, wait, total).input_bound_fraction <= 1.0


def test_timings_add_up_field_by_field() -> None:
    total = LoopTiming(2, 10, 1.0, 4.0) + LoopTiming(3, 20, 0.5, 2.0)
    assert total == LoopTiming(5, 30, 1.5, 6.0)
    assert total.examples_per_s == 5.0


def test_a_loop_that_took_no_time_has_no_rate() -> None:
    assert LoopTiming(1, 8, 0.0, 0.0).examples_per_s == 0.0
