"""Checkpoints: only the tool's own folder and files are touched; damage means start over."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tfshards.cli import app
from tfshards.errors import ConfigError
from tfshards.training.checkpoint import MARKER, STATE, Checkpoint
from tfshards.training.trainconfig import TrainConfig


def _variables(value: float = 1.0, shape: tuple[int, ...] = (3,)) -> dict[str, Any]:
    import tensorflow as tf

    return {"model": [tf.Variable(tf.fill(shape, value))]}


def _saved(folder: Path, value: float = 1.0, epochs: int = 2) -> Checkpoint:
    checkpoint = Checkpoint(str(folder), "key", _variables(value))
    for epoch in range(1, epochs + 1):
        checkpoint.save(epoch, [{"epoch": e} for e in range(1, epoch + 1)])
    return checkpoint


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_saved_checkpoint_resumes_into_the_variables(tmp_path: Path) -> None:
    _saved(tmp_path / "ck", value=7.0)
    fresh = _variables(0.0)
    done, history = Checkpoint(str(tmp_path / "ck"), "key", fresh).restore()
    assert (done, len(history)) == (2, 2)
    assert fresh["model"][0].numpy().tolist() == [7.0, 7.0, 7.0]
    names = sorted(os.listdir(tmp_path / "ck"))
    assert names[0] == MARKER and STATE in names
    assert all(n.startswith("epoch-00002.") for n in names if n.startswith("epoch-"))


def test_folder_with_user_files_is_refused_and_left_byte_identical(tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "model.keras").write_bytes(b"the user's model")
    before = _sha(folder / "model.keras")
    checkpoint = Checkpoint(str(folder), "key", _variables())
    with pytest.raises(ConfigError, match=r"models: expected an empty folder .* 'model.keras'"):
        checkpoint.restore()
    with pytest.raises(ConfigError, match="pass another --checkpoint-dir"):
        checkpoint.save(1, [])
    checkpoint.remove()
    assert os.listdir(folder) == ["model.keras"] and _sha(folder / "model.keras") == before


def test_a_file_named_as_checkpoint_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ck").write_text("notes")
    with pytest.raises(ConfigError, match="expected a folder for checkpoints, found a file"):
        Checkpoint(str(tmp_path / "ck"), "key").restore()
    assert (tmp_path / "ck").read_text() == "notes"


def test_remove_deletes_only_its_own_files(tmp_path: Path) -> None:
    checkpoint = _saved(tmp_path / "ck")
    (tmp_path / "ck" / "notes.txt").write_text("mine")
    (tmp_path / "ck" / "epoch-notes.txt").write_text("mine")  # named like, not one of its own
    (tmp_path / "ck" / "epoch-analysis").mkdir()
    (tmp_path / "ck" / "epoch-analysis" / "a.txt").write_text("mine")
    checkpoint.remove()
    assert sorted(os.listdir(tmp_path / "ck")) == ["epoch-analysis", "epoch-notes.txt", "notes.txt"]
    assert (tmp_path / "ck" / "epoch-analysis" / "a.txt").read_text() == "mine"
    _saved(tmp_path / "ck2").remove()
    assert not (tmp_path / "ck2").exists()  # nothing else there: the folder goes too


def test_a_save_folder_left_by_a_kill_mid_save_is_cleared_by_the_next_save(tmp_path: Path) -> None:
    """A multi-worker save writes into ``<prefix>_temp/`` first; a SIGKILL there leaves it."""
    checkpoint = _saved(tmp_path / "ck", epochs=1)
    left = tmp_path / "ck" / "epoch-00001-step-0000000008_temp"
    left.mkdir()
    (left / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"half")
    checkpoint.save(2, [{"epoch": 1}, {"epoch": 2}])
    assert not left.exists() and checkpoint.restore()[0] == 2
    left.mkdir()
    checkpoint.remove()
    assert not (tmp_path / "ck").exists()


def _truncate_data(folder: Path) -> None:
    data = next(p for p in folder.iterdir() if ".data-" in p.name)
    data.write_bytes(data.read_bytes()[:10])


def _garbage_index(folder: Path) -> None:
    index = next(p for p in folder.iterdir() if p.name.endswith(".index"))
    index.write_bytes(os.urandom(index.stat().st_size))


def _state_names_missing_prefix(folder: Path) -> None:
    state = json.loads((folder / STATE).read_text())
    state["prefix"] = "epoch-00009"
    state["files"] = {f"epoch-00009.{k.split('.', 1)[1]}": v for k, v in state["files"].items()}
    (folder / STATE).write_text(json.dumps(state))


def _unreadable_state(folder: Path) -> None:
    (folder / STATE).write_bytes(b"\x00{not json")


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (_truncate_data, "has a damaged epoch-00002.data-00000-of-00001"),
        (_garbage_index, "has a damaged epoch-00002.index"),
        (_state_names_missing_prefix, "misses epoch-00009."),
        (_unreadable_state, "has an unreadable state.json"),
    ],
)
def test_damaged_checkpoint_is_discarded_before_tensorflow_reads_it(
    tmp_path: Path, damage: Any, said: str
) -> None:
    _saved(tmp_path / "ck", value=7.0)
    damage(tmp_path / "ck")
    fresh = _variables(0.0)
    lines: list[str] = []
    assert Checkpoint(str(tmp_path / "ck"), "key", fresh).restore(lines.append) == (0, [])
    assert said in lines[0] and lines[0].endswith("starting over")
    assert fresh["model"][0].numpy().tolist() == [0.0, 0.0, 0.0]  # untouched
    assert not (tmp_path / "ck").exists()
    _saved(tmp_path / "ck", value=5.0)  # and training can checkpoint again
    assert Checkpoint(str(tmp_path / "ck"), "key", _variables(0.0)).restore()[0] == 2


def test_checkpoint_that_does_not_fit_the_model_is_one_line_and_discarded(tmp_path: Path) -> None:
    _saved(tmp_path / "ck")
    other = Checkpoint(str(tmp_path / "ck"), "key", _variables(shape=(4,)))
    with pytest.raises(ConfigError) as info:
        other.restore()
    assert "does not fit this model" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "ck").exists()


def test_checkpoint_files_are_fsynced_before_the_state_names_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real = os.fsync

    def record(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    _saved(tmp_path / "ck", epochs=1)
    folder = str(tmp_path / "ck")
    data = [os.path.join(folder, n) for n in os.listdir(folder) if n.startswith("epoch-")]
    state_at = max(i for i, p in enumerate(synced) if p.startswith(os.path.join(folder, ".")))
    for path in data:
        assert path in synced[:state_at], path
    assert synced.index(folder) < state_at


def test_checkpoint_dir_overlapping_an_output_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"found model_out 'models/model\.keras' overlapping"):
        TrainConfig(checkpoint_dir="models", model_out="models/model.keras")
    with pytest.raises(ConfigError, match="found live_dir"):
        TrainConfig(checkpoint_dir="results/train/live/ck")


def test_cli_refuses_checkpoint_dir_holding_the_model_in_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["train", "--manifest", str(tmp_path / "m.json"), "--checkpoint-dir", "models"],
    )
    assert result.exit_code == 1
    assert "checkpoint_dir: expected a folder of its own" in result.output
    assert "Traceback" not in result.output


def test_checkpoint_made_with_other_settings_is_removed_not_resumed(tmp_path: Path) -> None:
    Checkpoint(str(tmp_path / "ck"), "key-a").save(1, [])
    said: list[str] = []
    assert Checkpoint(str(tmp_path / "ck"), "key-b").restore(said.append) == (0, [])
    assert "made with other settings" in said[0]
    assert not (tmp_path / "ck").exists()


def test_a_checkpoint_made_with_other_settings_names_them(tmp_path: Path) -> None:
    before = {"epochs": 4, "seed": 0, "augment": ("flip",), "model": "small_cnn"}
    Checkpoint(str(tmp_path / "ck"), "key-a", settings=before).save(1, [])
    said: list[str] = []
    now = {**before, "epochs": 6, "seed": 1}
    assert Checkpoint(str(tmp_path / "ck"), "key-b", settings=now).restore(said.append) == (0, [])
    assert said == [
        f"checkpoint in {tmp_path / 'ck'} was made with other settings "
        "(epochs: 4, now 6; seed: 0, now 1); starting over"
    ]


def test_a_mid_epoch_checkpoint_holds_its_step_in_a_few_bytes(tmp_path: Path) -> None:
    checkpoint = _saved(tmp_path / "ck", value=3.0, epochs=1)
    checkpoint.save(1, [{"epoch": 1}], step=37)
    assert checkpoint.step == 37
    state = json.loads((tmp_path / "ck" / STATE).read_text())
    assert state["step"] == 37 and state["prefix"] == "epoch-00001-step-0000000037"
    assert (tmp_path / "ck" / STATE).stat().st_size < 4096  # the position: one integer
    checkpoint.release()  # the run ended
    fresh = Checkpoint(str(tmp_path / "ck"), "key", _variables(0.0))
    assert fresh.restore() == (1, [{"epoch": 1}]) and fresh.step == 37
    assert fresh.trackables["model"][0].numpy().tolist() == [3.0, 3.0, 3.0]
    names = [n for n in os.listdir(tmp_path / "ck") if n.startswith("epoch-")]
    assert names and all(n.startswith("epoch-00001-step-0000000037.") for n in names)


def test_a_folder_another_run_holds_is_refused_and_its_checkpoint_kept(tmp_path: Path) -> None:
    """Two runs on one folder discarded each other's checkpoint ("made with other
    settings") and one failed mid-save with a traceback; the second is refused now."""
    running = _saved(tmp_path / "ck", value=3.0, epochs=1)
    other = Checkpoint(str(tmp_path / "ck"), "another-key", _variables(0.0))
    with pytest.raises(ConfigError) as caught:
        other.restore()
    assert str(caught.value) == (
        f"{tmp_path / 'ck'}: expected a checkpoint folder no other run uses, found one "
        "another training run holds now; wait for it to end or pass another --checkpoint-dir"
    )
    assert json.loads((tmp_path / "ck" / STATE).read_text())["key"] == running.key
    running.remove()  # a finished run: its files go and the folder is free
    assert not (tmp_path / "ck").exists()
    assert other.restore() == (0, [])
