"""The dvclive log: off without a folder, a stale matrix removed, epochs and the matrix logged."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfshards.training import live
from tfshards.training.history import EpochResult
from tfshards.training.stall import LoopTiming

EPOCH = EpochResult(1, 0.5, 0.75, 0.625, 0.5, LoopTiming(2, 10, 1.0, 4.0))


def test_without_a_folder_nothing_is_logged() -> None:
    assert live.start(None, resumed=0) is None
    live.log_epoch(None, EPOCH)
    live.log_confusion(None, None, [[1]], ["a"], ([0], [0]))


def test_a_new_log_removes_a_stale_confusion_csv_and_logs_each_epoch_at_its_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "live").mkdir()
    (tmp_path / "live/confusion.csv").write_text("actual,a\na,9\n")
    log = live.start("live", resumed=0)
    assert not (tmp_path / "live/confusion.csv").exists()
    live.log_epoch(log, EPOCH)
    live.log_epoch(log, EPOCH)
    log.end()
    rows = (tmp_path / "live/plots/metrics/val_loss.tsv").read_text().splitlines()
    assert rows == ["step\tval_loss", "0\t0.625", "1\t0.625"]


def test_a_resumed_log_goes_on_counting_and_keeps_the_matrix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "live").mkdir()
    (tmp_path / "live/confusion.csv").write_text("actual,a\na,9\n")
    log = live.start("live", resumed=2)
    assert log.step == 2
    assert (tmp_path / "live/confusion.csv").exists()
    log.end()


def test_epochs_logged_after_the_checkpoint_are_not_left_twice_on_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill between an epoch's log and its checkpoint: the resumed run logs that epoch
    again, and each series held step 1 twice (0, 1, 1, 2)."""
    monkeypatch.chdir(tmp_path)
    log = live.start("live", resumed=0)
    for _ in range(2):  # epochs 1 and 2 logged; the checkpoint holds epoch 1 only
        live.log_epoch(log, EPOCH)
    log.end()
    log = live.start("live", resumed=1)
    for _ in range(2):  # epochs 2 and 3
        live.log_epoch(log, EPOCH)
    log.end()
    for series in ("val_loss", "loss", "accuracy"):
        rows = (tmp_path / f"live/plots/metrics/{series}.tsv").read_text().splitlines()
        assert [r.split("\t")[0] for r in rows] == ["step", "0", "1", "2"], series


def test_the_confusion_matrix_goes_to_a_csv_and_two_plots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    log = live.start("live", resumed=0)
    live.log_confusion("live", log, [[1, 1], [0, 2]], ["a", "b"], ([0, 0, 1, 1], [0, 1, 1, 1]))
    log.end()
    assert (tmp_path / "live/confusion.csv").read_text().splitlines() == [
        "actual,a,b",
        "a,1,1",
        "b,0,2",
    ]
    assert (tmp_path / "live/plots/sklearn/confusion_matrix.json").exists()
    assert list((tmp_path / "live/plots/custom").glob("val_class_accuracy*"))
