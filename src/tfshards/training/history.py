"""One run's epochs: their metrics and timings, the run's summary, and when to stop early."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tfshards.errors import ConfigError
from tfshards.training.stall import LoopTiming

MODEL_METRICS = ("loss", "accuracy", "val_loss", "val_accuracy")  # val_* need a val set
# Every series an epoch logs (:meth:`EpochResult.metrics`): dvclive's plots/metrics/<name>.tsv.
SERIES = (*MODEL_METRICS, "examples_per_s", "input_bound_fraction")


@dataclass(frozen=True)
class EpochResult:
    """One epoch's metrics (val ones are None without a validation set) and its timing."""

    epoch: int
    loss: float
    accuracy: float
    val_loss: float | None
    val_accuracy: float | None
    timing: LoopTiming

    def metrics(self) -> dict[str, float]:
        values = {
            "loss": self.loss,
            "accuracy": self.accuracy,
            "val_loss": self.val_loss,
            "val_accuracy": self.val_accuracy,
            "examples_per_s": self.timing.examples_per_s,
            "input_bound_fraction": self.timing.input_bound_fraction,
        }
        return {k: v for k, v in values.items() if v is not None}

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> EpochResult:
        return cls(**{**doc, "timing": LoopTiming(**doc["timing"])})


def summarize(
    epochs: Sequence[EpochResult], *, device: str, train_records: int, val_records: int
) -> dict[str, Any]:
    """The summary metrics: the last epoch's model metrics, steady-state timings.

    Timings leave out the first epoch when there are more (it traces and
    compiles the steps and fills the input pipeline), so ``examples_per_s``
    and ``input_bound_fraction`` describe the run's steady state.
    """
    if not epochs:
        raise ConfigError("no epochs to summarize")
    last = epochs[-1]
    steady = epochs[1:] or epochs
    timing = steady[0].timing
    for epoch in steady[1:]:
        timing = timing + epoch.timing
    out: dict[str, Any] = {k: round(v, 6) for k, v in last.metrics().items() if k in MODEL_METRICS}
    out.update(
        epochs=len(epochs),
        examples_per_s=round(timing.examples_per_s, 1),
        input_bound_fraction=round(timing.input_bound_fraction, 4),
        device=device,
        train_records=train_records,
        val_records=val_records,
    )
    return out


def stop_early(results: Sequence[EpochResult], patience: int, metric: str) -> bool:
    """True when the last ``early_stopping`` epochs brought no better validation metric."""
    if not patience or len(results) <= patience:
        return False
    name = metric
    values = [r.metrics().get(name) for r in results]
    if any(v is None for v in values):
        return False  # no validation set: nothing to watch
    sign = -1.0 if name == "val_accuracy" else 1.0  # lower is better after the sign
    scores = [sign * float(v) for v in values if v is not None]
    return min(scores[-patience:]) >= min(scores[:-patience])


def early_stop_note(results: Sequence[EpochResult], patience: int, metric: str, epochs: int) -> str:
    """Why :func:`stop_early` stopped, and which weights the model keeps: one line."""
    sign = -1.0 if metric == "val_accuracy" else 1.0
    scores = [(sign * float(r.metrics()[metric]), r.epoch) for r in results]
    best_score, best_epoch = min(scores)
    return (
        f"stopped early after epoch {len(results)}/{epochs}: {metric} not better than "
        f"{sign * best_score:.4f} (epoch {best_epoch}) for {patience} epochs; the model keeps "
        f"the weights of epoch {len(results)}, the last trained, not those of epoch {best_epoch}"
    )
