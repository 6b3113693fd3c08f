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
from pathlib import Path
from typing import Any

from tfshards.errors import ConfigError
from tfshards.project import yamlfile

LOCK = "dvc.lock"


def recorded_md5(path: str, lock: str = LOCK) -> str | None:
    """The md5 ``lock`` records for the output ``path`` (relative to the lock's folder), if any."""
    if not os.path.isfile(lock):
        return None
    try:
        doc = yamlfile.plain(yamlfile.load(Path(lock)))
    except ConfigError:  # not ours to judge: DVC says what is wrong with its lock
        return None
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
    """One line when ``path`` is not the copy ``lock`` records (None when it is, or when
    there is no lock or no record of it)."""
    expected = recorded_md5(path, lock)
    if expected is None or not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        found = hashlib.md5(f.read(), usedforsecurity=False).hexdigest()
    if found == expected:
        return None
    return (
        f"{path}: expected the version {lock} records (md5 {expected[:12]}), found another "
        f"(md5 {found[:12]}: an experiment's output left in the workspace?); this write grows "
        f"from it, so its version differs from the committed one's; `dvc checkout` first "
        "grows from the committed version"
    )
