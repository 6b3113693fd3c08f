"""One run's epochs: the summary, JSON round trips, and when to stop early."""

from __future__ import annotations

import json

import pytest

from tfshards.errors import ConfigError
from tfshards.training.history import SERIES, EpochResult, early_stop_note, stop_early, summarize
from tfshards.training.stall import LoopTiming


def test_summary_timings_leave_out_the_first_epoch() -> None:
    epochs = [
        EpochResult(1, 2.0, 0.1, 2.1, 0.1, LoopTiming(10, 640, wait_s=9.0, total_s=10.0)),
        EpochResult(2, 0.5, 0.8, 0.6, 0.7, LoopTiming(10, 640, wait_s=1.0, total_s=2.0)),
        EpochResult(3, 0.25, 0.9, 0.3, 0.875, LoopTiming(10, 640, wait_s=0.0, total_s=2.0)),
    ]
    metrics = summarize(epochs, device="CPU", train_records=640, val_records=100)
    assert metrics == {
        "accuracy": 0.9,
        "device": "CPU",
        "epochs": 3,
        "examples_per_s": 320.0,
        "input_bound_fraction": 0.25,
        "loss": 0.25,
        "train_records": 640,
        "val_accuracy": 0.875,
        "val_loss": 0.3,
        "val_records": 100,
    }


def _epoch(n: int, val_loss: float) -> EpochResult:
    return EpochResult(n, 1.0, 0.5, val_loss, 0.5, LoopTiming(1, 1, 0.0, 1.0))


def test_early_stopping_waits_patience_epochs_for_a_better_val_loss() -> None:
    losses = [1.0, 0.5, 0.6, 0.7]
    history = [_epoch(i + 1, v) for i, v in enumerate(losses)]
    assert not stop_early(history[:3], 2, "val_loss")  # 1 epoch since the best
    assert stop_early(history, 2, "val_loss")  # 2 epochs, none better than 0.5
    assert not stop_early(history, 0, "val_loss")  # off
    assert not stop_early([*history, _epoch(5, 0.4)], 2, "val_loss")


def test_early_stop_says_why_and_which_weights_are_kept() -> None:
    history = [_epoch(i + 1, v) for i, v in enumerate([1.0, 0.5, 0.6, 0.7])]
    assert early_stop_note(history, 2, "val_loss", 10) == (
        "stopped early after epoch 4/10: val_loss not better than 0.5000 (epoch 2) for 2 "
        "epochs; the model keeps the weights of epoch 4, the last trained, not those of epoch 2"
    )


def test_an_epoch_round_trips_through_json() -> None:
    epoch = EpochResult(2, 0.5, 0.8, None, None, LoopTiming(3, 96, 0.25, 1.5))
    doc = json.loads(json.dumps(epoch.to_json()))
    assert EpochResult.from_json(doc) == epoch


def test_without_validation_the_metrics_leave_out_the_val_ones() -> None:
    epoch = EpochResult(1, 0.5, 0.75, None, None, LoopTiming(2, 10, 1.0, 4.0))
    assert epoch.metrics() == {
        "loss": 0.5,
        "accuracy": 0.75,
        "examples_per_s": 2.5,
        "input_bound_fraction": 0.25,
    }


def test_one_epoch_is_summarized_with_its_own_timing_and_none_is_refused() -> None:
    epoch = EpochResult(1, 0.5, 0.75, None, None, LoopTiming(2, 10, 1.0, 4.0))
    metrics = summarize([epoch], device="CPU", train_records=10, val_records=0)
    assert (metrics["examples_per_s"], metrics["input_bound_fraction"]) == (2.5, 0.25)
    assert "val_loss" not in metrics
    with pytest.raises(ConfigError, match="no epochs to summarize"):
        summarize([], device="CPU", train_records=0, val_records=0)


def test_early_stopping_on_val_accuracy_waits_for_a_higher_one() -> None:
    def epoch(n: int, val_accuracy: float) -> EpochResult:
        return EpochResult(n, 1.0, 0.5, 1.0, val_accuracy, LoopTiming(1, 1, 0.0, 1.0))

    history = [epoch(i + 1, v) for i, v in enumerate([0.5, 0.9, 0.8])]
    assert stop_early(history, 1, "val_accuracy")  # 0.8 is not above 0.9
    assert not stop_early([*history[:2]], 1, "val_accuracy")  # 0.9 is above 0.5
    assert early_stop_note(history, 1, "val_accuracy", 5).startswith(
        "stopped early after epoch 3/5: val_accuracy not better than 0.9000 (epoch 2)"
    )


def test_without_validation_nothing_stops_early() -> None:
    history = [
        EpochResult(n, 1.0, 0.5, None, None, LoopTiming(1, 1, 0.0, 1.0)) for n in range(1, 6)
    ]
    assert not stop_early(history, 1, "val_loss")


def test_every_series_an_epoch_logs_is_named_in_series() -> None:
    """The live folder's check keeps plots/metrics/<name>.tsv for these names only."""
    assert tuple(_epoch(1, 0.5).metrics()) == SERIES
