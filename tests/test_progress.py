"""Progress: a tqdm bar on a terminal, plain lines in a log."""

from __future__ import annotations

import pytest

from tfshards import progress


def test_a_terminal_gets_a_bar(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    monkeypatch.setattr(progress, "_is_terminal", lambda: True)
    with progress.Progress("write", 4) as bar:
        bar.update(4, 4_000_000)
        bar.note("a line above the bar")
    err = capsys.readouterr().err
    assert "write: 100%" in err and "4.00/4.00" in err and "a line above the bar" in err


def test_a_log_gets_a_line_every_interval(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setattr(progress, "_is_terminal", lambda: False)
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)
    with progress.Progress("write", 4) as bar:
        bar.update(2)
    assert capsys.readouterr().err.startswith("write: 2/4 rec in ")
