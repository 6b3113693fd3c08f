"""Time a loop over batches: how long each step waited for data (the input stall)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

B = TypeVar("B")
R = TypeVar("R")


@dataclass(frozen=True)
class LoopTiming:
    """How a loop over batches spent its time.

    Attributes:
        steps: batches processed.
        examples: records in them.
        wait_s: seconds blocked in ``next(iterator)``: the step had no batch.
        total_s: wall seconds of the whole loop, waits included.
    """

    steps: int
    examples: int
    wait_s: float
    total_s: float

    @property
    def input_bound_fraction(self) -> float:
        """Share of the loop spent waiting for data, in [0, 1].

        Near 0: the model is the bottleneck (batches were ready). Near 1: the
        input pipeline is; a faster model would not make training faster.
        """
        if self.total_s <= 0:
            return 0.0
        return min(1.0, max(0.0, self.wait_s / self.total_s))

    @property
    def examples_per_s(self) -> float:
        return self.examples / self.total_s if self.total_s > 0 else 0.0

    def __add__(self, other: LoopTiming) -> LoopTiming:
        return LoopTiming(
            self.steps + other.steps,
            self.examples + other.examples,
            self.wait_s + other.wait_s,
            self.total_s + other.total_s,
        )


def timed_loop(
    batches: Iterator[B],
    steps: int,
    step: Callable[[B], R],
    *,
    count: Callable[[B], int],
    sync: Callable[[R], object] = lambda _: None,
    clock: Callable[[], float] = time.perf_counter,
) -> LoopTiming:
    """Run ``step`` on up to ``steps`` batches, timing the waits for data.

    On a GPU a step returns once its work is queued, so the host could run
    ahead and wait for data while the GPU is still busy: that wait would be
    counted as a stall although the GPU never idled. ``sync`` (blocking until
    a step's result exists) is therefore called on the *previous* step's
    result after queueing the next one: at most one step is in flight, the
    GPU never starves for work the host could have queued, and a wait in
    ``next()`` is time the accelerator really had nothing to do. On CPU a
    step is done when it returns and the sync costs nothing.

    Args:
        batches: the iterator; stops early if it runs out.
        steps: batches to take.
        step: runs one batch; returns what ``sync`` waits on.
        count: records in a batch.
        sync: blocks until a step's result is computed.
        clock: seconds, monotonic (injected by tests).
    """
    wait = 0.0
    examples = done = 0
    pending: list[R] = []
    start = clock()
    while done < steps:
        before = clock()
        try:
            batch = next(batches)
        except StopIteration:
            break
        wait += clock() - before
        pending.append(step(batch))
        if len(pending) > 1:
            sync(pending.pop(0))
        examples += count(batch)
        done += 1
    for result in pending:
        sync(result)
    return LoopTiming(done, examples, wait, clock() - start)
