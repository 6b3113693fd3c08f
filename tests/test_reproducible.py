"""The same inputs copied elsewhere reproduce the same version, manifest and dvc.lock outs."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dvcrepo import run as _run

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
STAGES = ("list", "write", "validate")


def _project(root: Path, raw: Path) -> Path:
    """This repository's list -> write -> validate pipeline over a copy of ``raw``.

    The raw files and params are copied byte for byte only (``copyfile``), then
    given mtimes of their own, as a plain ``cp`` or another clone would.
    """
    root.mkdir(parents=True)
    pipeline = yaml.safe_load((REPO / "dvc.yaml").read_text())
    pipeline["stages"] = {k: v for k, v in pipeline["stages"].items() if k in STAGES}
    pipeline.pop("plots", None)
    (root / "dvc.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    for name in ("params.yaml", ".dvcignore"):
        shutil.copyfile(REPO / name, root / name)
    for name in ("stages", "src"):
        shutil.copytree(
            REPO / name,
            root / name,
            copy_function=shutil.copyfile,
            ignore=shutil.ignore_patterns("__pycache__", "*.so"),
        )
    shutil.copytree(raw, root / "data" / "raw", copy_function=shutil.copyfile)
    stamp = 1_500_000_000 + len(str(root))  # a different mtime in each copy
    for path in (root / "data" / "raw").rglob("*"):
        os.utime(path, (stamp, stamp))
    _run(["git", "init", "-q"], root)
    _run(["dvc", "init", "-q"], root)
    _run(["git", "add", "-A"], root)
    _run(["git", "commit", "-qm", "pipeline"], root)
    _run(["dvc", "repro", "-f"], root)
    return root


def _outs(lock: dict[str, Any], stage: str) -> list[dict[str, Any]]:
    outs: list[dict[str, Any]] = lock["stages"][stage]["outs"]
    return outs


def test_copies_at_other_paths_with_new_mtimes_reproduce_byte_identical(tmp_path):
    raw = tmp_path / "raw"
    _run([sys.executable, str(REPO / "stages" / "sample_data.py"), "digits", str(raw)], tmp_path)
    one = _project(tmp_path / "one" / "project", raw)
    two = _project(tmp_path / "b" / "much" / "deeper" / "copy", raw)
    manifest = (one / "data" / "manifest.json").read_bytes()
    assert manifest == (two / "data" / "manifest.json").read_bytes()
    lock_one = yaml.safe_load((one / "dvc.lock").read_text())
    lock_two = yaml.safe_load((two / "dvc.lock").read_text())
    for stage in STAGES:
        assert _outs(lock_one, stage) == _outs(lock_two, stage), stage
    versions = [p.name for p in (one / "data" / "shards").iterdir()]
    assert versions == [p.name for p in (two / "data" / "shards").iterdir()]
    assert len(versions) == 1
