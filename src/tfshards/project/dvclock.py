"""What the project's ``dvc.lock`` records for a file: is the workspace copy the locked one?

A write grows from the manifest in the workspace (``previous: auto``). After
``dvc exp run`` and a ``git checkout`` that throws the experiment away,
``dvc.lock`` is the committed one again but the manifest is still the
experiment's: the next ``dvc repro`` grows from it and names another version
than the committed one. DVC runs a stage from the folder of its ``dvc.yaml``,
so the lock is looked up there (the working directory).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from typing import Any

from tfshards.project import plainyaml

LOCK = "dvc.lock"


def recorded_md5(path: str, lock: str = LOCK, text: str | None = None) -> str | None:
    """The md5 ``lock`` records for the output ``path`` (relative to the lock's folder), if
    any; ``text``: the lock's content as another commit had it (default: read ``lock``)."""
    # Unreadable: not ours to judge, DVC says what is wrong with its lock.
    doc = plainyaml.read(lock) if text is None else plainyaml.parse(text)
    wanted = os.path.normpath(os.path.relpath(path, os.path.dirname(os.path.abspath(lock))))
    stages = doc.get("stages") if isinstance(doc, dict) else None
    for stage in stages.values() if isinstance(stages, dict) else ():
        for out in _outs(stage):
            if os.path.normpath(str(out.get("path", ""))) == wanted and out.get("md5"):
                return str(out["md5"])
    return None


def _outs(stage: Any) -> list[dict[str, Any]]:
    outs = stage.get("outs") if isinstance(stage, dict) else None
    return [o for o in outs or () if isinstance(o, dict)]


def unlocked(path: str, lock: str = LOCK) -> str | None:
    """One line when ``path`` is not the copy ``lock`` records, or not the one the lock of
    git's ``HEAD`` records (None when it is both, or when there is no record of it).

    The second catches chained experiments: after ``dvc exp run -S a=1``, the workspace
    lock records that experiment's manifest, so ``dvc exp run -S a=0`` (HEAD's params)
    grew from it and named another version than HEAD's without a word.
    """
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        found = hashlib.md5(f.read(), usedforsecurity=False).hexdigest()
    expected = recorded_md5(path, lock)
    if expected is not None and found != expected:
        return _line(path, lock, expected, found)
    head = _at_head(lock)  # read only when the workspace's lock agrees
    expected = recorded_md5(path, lock, head) if head is not None else None
    if expected is not None and found != expected:
        return _line(path, f"HEAD's {lock}", expected, found)
    return None


def _line(path: str, where: str, expected: str, found: str) -> str:
    # The workspace lock agrees with the manifest: `dvc checkout` alone would restore it.
    restore = (
        "git checkout dvc.lock && dvc checkout" if where.startswith("HEAD") else "dvc checkout"
    )
    return (
        f"{path}: expected the version {where} records (md5 {expected[:12]}), found another "
        f"(md5 {found[:12]}: an uncommitted run's or an experiment's output?); a write "
        "that grows from it names another version than the same data grown from the "
        f"committed one; `{restore}` first brings the committed version back"
    )


def _at_head(lock: str) -> str | None:
    """``lock`` as git's HEAD commit has it; None outside git or where HEAD has none."""
    folder = os.path.dirname(os.path.abspath(lock))
    name = os.path.basename(lock)
    try:
        done = subprocess.run(
            ["git", "show", f"HEAD:./{name}"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None
