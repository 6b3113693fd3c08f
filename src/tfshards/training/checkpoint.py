"""Per-epoch training checkpoints, so a killed run resumes after its last finished epoch.

A checkpoint holds the model's and optimizer's variables (random-layer seed
states included) and the input iterator's position, written with
``tf.train.Checkpoint`` after every epoch, plus ``state.json``: the epochs
done, their metrics, and a key naming the settings they were trained with.
``state.json`` is replaced atomically after the variables are written, so a
kill at any moment leaves the previous epoch's checkpoint whole. A checkpoint
made with other settings is not resumed but removed. The iterator's state
includes its shuffle buffer (up to ~64 MB of records by default).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tfshards import jsonfile

STATE = "state.json"


@dataclass
class Checkpoint:
    """The checkpoint folder of one training run (a local directory).

    Attributes:
        directory: where checkpoints go; created on the first save.
        key: names the settings; a checkpoint with another key is not resumed.
        trackables: what ``tf.train.Checkpoint`` saves, by name (lists of
            variables, a ``tf.data`` iterator).
    """

    directory: str
    key: str
    trackables: dict[str, Any] = field(default_factory=dict)

    def restore(self, log: Callable[[str], None] | None = None) -> tuple[int, list[dict[str, Any]]]:
        """Load the last finished epoch into the trackables: ``(epochs done, their metrics)``.

        ``(0, [])`` when there is no checkpoint, or one made with other
        settings (which is removed, and said through ``log``).
        """
        state = _read_state(os.path.join(self.directory, STATE))
        if state is None:
            return 0, []
        if state.get("key") != self.key:
            if log is not None:
                log(f"checkpoint in {self.directory} was made with other settings; starting over")
            self.remove()
            return 0, []
        import tensorflow as tf

        tf.train.Checkpoint(**self.trackables).read(
            os.path.join(self.directory, state["prefix"])
        ).assert_consumed()
        return int(state["epochs"]), list(state["history"])

    def save(self, epochs: int, history: list[dict[str, Any]]) -> None:
        """Write the trackables after epoch ``epochs``, then drop the previous checkpoint."""
        import tensorflow as tf

        os.makedirs(self.directory, exist_ok=True)
        prefix = f"epoch-{epochs:05d}"
        tf.train.Checkpoint(**self.trackables).write(os.path.join(self.directory, prefix))
        state = {"epochs": epochs, "history": history, "key": self.key, "prefix": prefix}
        jsonfile.save(state, os.path.join(self.directory, STATE))  # durable, then visible
        for name in os.listdir(self.directory):
            if name.startswith("epoch-") and not name.startswith(prefix + "."):
                os.remove(os.path.join(self.directory, name))

    def remove(self) -> None:
        """Delete the checkpoint folder (a finished run needs it no more)."""
        shutil.rmtree(self.directory, ignore_errors=True)


def settings_key(settings: dict[str, Any]) -> str:
    """A short hash of the settings a run's epochs depend on (sorted JSON, SHA-256)."""
    return jsonfile.digest(settings)[:16]


def _read_state(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: treated as made with other settings, so removed
    return state if isinstance(state, dict) else {}
