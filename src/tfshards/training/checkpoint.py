"""Training checkpoints, so a killed run resumes at its last saved step, mid-epoch or not.

A checkpoint holds the model's and optimizer's variables (random-layer seed
states included) and the running metrics of the epoch under way, written with
``tf.train.Checkpoint`` after every epoch (and every N steps when asked), plus
``state.json``: the epochs done, their metrics, the training steps done (the
input's position: the loader's epoch order starts anywhere, so no iterator
state, a few bytes in place of a shuffle buffer of up to ~64 MB), a key
naming the settings they were trained with, and the size and SHA-256 of each
file of the checkpoint. The files are fsynced, then ``state.json`` is
replaced atomically, so a kill or power loss at any moment leaves the
previous checkpoint whole.

The folder is the tool's own: a run writes a marker file (:data:`MARKER`) into
a folder that is new or empty before it restores or saves, and holds the
folder (``flock``) until it ends, so a second run on it is refused. Nothing is
ever saved into, resumed from or deleted from a folder without the marker. Only the files this
module names (the marker, ``state.json``, ``epoch-*``) are ever deleted; the
folder itself only when that leaves it empty. A checkpoint made with other
settings, or one whose files do not match ``state.json`` (truncated, replaced,
missing), is discarded with one line through ``log`` and training starts over:
its files are checked before TensorFlow reads any of them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tfshards import atomicfile, jsonfile
from tfshards.errors import ConfigError

STATE = "state.json"
MARKER = ".tfshards-checkpoint"  # says the folder is tfshards' own (made by its first save)
_PREFIX = "epoch-"
# A checkpoint file by name: TensorFlow's ".index" and ".data-NNNNN-of-NNNNN" of a prefix,
# or the "_temp" folder a multi-worker save writes into. A user's "epoch-notes.txt" in
# the folder is not one (every "epoch-" name was deleted once).
_OWN_FILE = re.compile(r"^epoch-\d{5}(?:-step-\d{10})?(?:\.index|\.data-\d{5}-of-\d{5}|_temp)$")
Log = Callable[[str], None]


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
    step: int = 0  # training steps done, as the last save or restore left them
    settings: dict[str, Any] = field(default_factory=dict)  # what ``key`` names, kept to say
    # which of them a checkpoint made with other settings differs in
    _held: int | None = field(default=None, repr=False)  # the folder's fd, flock-ed

    def claim(self) -> None:
        """Check the folder is absent, empty or marked as tfshards' own; make and mark it,
        and hold it for this run (a ``flock`` the kernel drops when the process ends).

        Raises:
            ConfigError: it is a file, a folder holding files tfshards did not make, or
                one another run holds: two runs on one folder discarded each other's
                checkpoint as "made with other settings" and failed mid-save.
        """
        if not (os.path.isdir(self.directory) and os.path.exists(self._path(MARKER))):
            self._check_unmarked()
            atomicfile.make_dirs(self.directory)
            if not os.path.exists(self._path(MARKER)):
                mark = {"made_by": "tfshards", "holds": "training checkpoints"}
                jsonfile.save(mark, self._path(MARKER))
        self._hold()

    def _hold(self) -> None:
        if self._held is not None:
            return
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(
                f"{self.directory}: expected a checkpoint folder no other run uses, found "
                "one another training run holds now; wait for it to end or pass another "
                "--checkpoint-dir",
                option="checkpoint_dir",
                path=self.directory,
            ) from None
        self._held = fd

    def release(self) -> None:
        """Let another run take the folder (the end of this process, or of this object,
        does it too)."""
        if self._held is not None:
            fd, self._held = self._held, None
            os.close(fd)

    def __del__(self) -> None:
        self.release()

    def _check_unmarked(self) -> None:
        """Refuse a file, or a folder holding anything, at a path without the marker."""
        if os.path.exists(self.directory) and not os.path.isdir(self.directory):
            raise ConfigError(
                f"{self.directory}: expected a folder for checkpoints, found a file; "
                "pass another --checkpoint-dir",
                option="checkpoint_dir",
                path=self.directory,
            )
        names = sorted(os.listdir(self.directory)) if os.path.isdir(self.directory) else []
        if names:
            raise ConfigError(
                f"{self.directory}: expected an empty folder or one tfshards made for "
                f"checkpoints (with {MARKER}), found {len(names)} entries it did not make "
                f"(first: {names[0]!r}); pass another --checkpoint-dir",
                option="checkpoint_dir",
                path=self.directory,
            )

    def restore(self, log: Log | None = None) -> tuple[int, list[dict[str, Any]]]:
        """Load the last checkpoint into the trackables: ``(epochs done, their metrics)``.

        :attr:`step` becomes the training steps it had done. ``(0, [])`` when
        there is no checkpoint, or one made with other settings or with damaged
        files (which is discarded, and said through ``log``).

        Raises:
            ConfigError: the folder is not tfshards' own (:meth:`claim`), or the
                checkpoint's files are whole but do not fit the model (it is
                discarded first, so the next run starts over).
        """
        self.claim()
        self.step = 0
        state = _read_state(self._path(STATE))
        if state is None:
            return 0, []
        problem = self._problem(state)
        if problem is not None:
            if log is not None:
                log(f"checkpoint in {self.directory} {problem}; starting over")
            self.remove()
            return 0, []
        import tensorflow as tf

        try:
            tf.train.Checkpoint(**self.trackables).read(
                self._path(state["prefix"])
            ).assert_consumed()
        except (tf.errors.OpError, ValueError, AssertionError) as exc:
            # Whole files that do not fit: a user model changed its layers under the
            # same name. Some variables may already hold restored values, so only a
            # new run can start clean.
            self.remove()
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(
                f"{self.directory}: checkpoint {state['prefix']} does not fit this model "
                f"({why[:200]}); it was discarded, run again to start from epoch 1",
                option="checkpoint_dir",
                path=self.directory,
            ) from None
        self.step = int(state.get("step", 0))
        return int(state["epochs"]), list(state["history"])

    def save(self, epochs: int, history: list[dict[str, Any]], *, step: int | None = None) -> None:
        """Write the trackables after epoch ``epochs`` (``step`` training steps in, when
        given), then drop the previous checkpoint."""
        import tensorflow as tf

        self.claim()
        prefix = f"{_PREFIX}{epochs:05d}" + ("" if step is None else f"-step-{step:010d}")
        tf.train.Checkpoint(**self.trackables).write(self._path(prefix))
        files = {}
        for name in sorted(os.listdir(self.directory)):
            if name.startswith(prefix + "."):
                files[name] = _fsynced_digest(self._path(name))
        atomicfile.fsync_dir(self.directory)
        state = {
            "epochs": epochs,
            "files": files,
            "history": history,
            "key": self.key,
            "prefix": prefix,
            "settings": self.settings,
            "step": step or 0,
        }
        jsonfile.save(state, self._path(STATE))  # durable, then visible
        self.step = step or 0
        for name in os.listdir(self.directory):
            if _OWN_FILE.match(name) and not name.startswith(prefix + "."):
                _delete(self._path(name))

    def remove(self) -> None:
        """Delete the checkpoint's own files (a finished run needs them no more).

        Only in a folder marked as tfshards' own, and only the files this module
        makes; the folder goes too when that leaves it empty.
        """
        if not os.path.exists(self._path(MARKER)):
            return
        for name in os.listdir(self.directory):
            if name == STATE or _OWN_FILE.match(name) or atomicfile.is_temp_name(name):
                _delete(self._path(name))
        os.remove(self._path(MARKER))
        with contextlib.suppress(OSError):  # something else lives there: it stays, and the folder
            os.rmdir(self.directory)
        self.release()

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def _problem(self, state: dict[str, Any]) -> str | None:
        """Why the checkpoint described by ``state`` cannot be resumed, or None."""
        if not state:
            return f"has an unreadable {STATE}"
        if state.get("key") != self.key:
            return f"was made with other settings{_changed(state.get('settings'), self.settings)}"
        files, prefix = state.get("files"), state.get("prefix")
        if not isinstance(files, dict) or not files or not isinstance(prefix, str):
            return f"has an unreadable {STATE}"
        for name, expected in sorted(files.items()):
            if not name.startswith(prefix + ".") or os.sep in name:
                return f"has an unreadable {STATE}"
            try:
                found = _digest(self._path(name))
            except FileNotFoundError:
                return f"misses {name}"
            if found != expected:
                return f"has a damaged {name} (expected {expected}, found {found})"
        return None


def _changed(before: Any, now: dict[str, Any], shown: int = 4) -> str:
    """`` (epochs: 4, now 6; seed: 0, now 1)``: the settings that differ, or ``""`` when the
    checkpoint names none (made before it kept them) or none differs by name."""
    if not isinstance(before, dict) or not now:
        return ""
    now = json.loads(json.dumps(now))  # as the state file holds them: tuples are lists
    names = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
    parts = [f"{k}: {before.get(k)!r}, now {now.get(k)!r}" for k in names[:shown]]
    more = f"; {len(names) - shown} more" if len(names) > shown else ""
    return f" ({'; '.join(parts)}{more})" if parts else ""


def _delete(path: str) -> None:
    """Remove a checkpoint file, or the ``<prefix>_temp`` folder TensorFlow writes a
    multi-worker save into (left behind by a run killed while saving)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


def settings_key(settings: dict[str, Any]) -> str:
    """A short hash of the settings a run's epochs depend on (sorted JSON, SHA-256)."""
    return jsonfile.digest(settings)[:16]


def _digest(path: str) -> str:
    """``"<size>:<sha256>"`` of a file."""
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
            size += len(chunk)
    return f"{size}:{sha.hexdigest()}"


def _fsynced_digest(path: str) -> str:
    """:func:`_digest` of a file just written, after making its bytes durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return _digest(path)


def _read_state(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: discarded
    return state if isinstance(state, dict) else {}
