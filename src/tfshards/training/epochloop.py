"""One training epoch's steps, from any step within it, checkpointed every N steps."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from tfshards.training.stall import LoopTiming, timed_loop
from tfshards.training.steps import TrainSteps

Save = Callable[..., None]  # save(step=global steps done)
OnBatch = Callable[[int, Any], None]


class EpochLoop:
    """Steps of ``batches``-step epochs over one endless ``iterator``.

    Args:
        steps: the compiled train step.
        iterator: the training batches, positioned at the first step to run.
        batches: steps per epoch.
        every: save after every global step that is a multiple of ``every``
            (the epoch's last step excepted: its save follows its evaluation);
            0: never mid-epoch.
        count: records of a step's batch (default: the labels' length).
    """

    def __init__(
        self,
        steps: TrainSteps,
        iterator: Any,
        batches: int,
        every: int,
        count: Callable[[Any], int] | None = None,
    ) -> None:
        self.steps, self.iterator, self.batches, self.every = steps, iterator, batches, every
        self.count = count or (lambda batch: int(batch[1].shape[0]))

    def epoch(
        self, epoch: int, done: int, save: Save | None, on_batch: OnBatch | None = None
    ) -> tuple[int, LoopTiming]:
        """Run epoch ``epoch`` (from 1) from global step ``done`` to its end: its timing."""
        end = epoch * self.batches
        done = max(done, end - self.batches)
        counter = itertools.count(done)

        def step(batch: Any) -> Any:
            if on_batch is not None:
                on_batch(next(counter), batch)
            return self.steps.train(batch[0], batch[1])

        timing = LoopTiming(0, 0, 0.0, 0.0)
        while done < end:
            stop = end if not self.every else min(end, (done // self.every + 1) * self.every)
            timing += timed_loop(
                self.iterator,
                stop - done,
                step,
                count=self.count,
                sync=lambda loss: loss.numpy(),
            )
            done = stop
            if done < end and save is not None:
                save(step=done)
        return epoch, timing
