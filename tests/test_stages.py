"""dvc.yaml's stage declarations: every library module a stage runs is one of its deps, no more.

``make deps`` (``python tests/stagedeps.py --fix``) rewrites dvc.yaml to match.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from stagedeps import check, fix, script_of

REPO = Path(__file__).resolve().parents[1]
STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
FOUND = check(REPO / "dvc.yaml")


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_imported_library_module_is_a_dep(name):
    stage = STAGES[name]
    script = script_of(stage)
    assert script, f"{name}: cmd runs no stages/*.py script"
    assert script in set(stage["deps"])
    missing, _ = FOUND[name]
    assert not missing, f"stage {name}: add to deps: {missing} (make deps)"


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_library_dep_is_imported(name):
    _, stray = FOUND[name]
    assert not stray, f"stage {name}: its script never imports {stray}; drop them (make deps)"


def _planted(tmp_path: Path) -> Path:
    """A repo of one stage whose script imports ``tfshards.b``, which imports ``tfshards.a``."""
    (tmp_path / "src/tfshards").mkdir(parents=True)
    (tmp_path / "stages").mkdir()
    (tmp_path / "src/tfshards/__init__.py").write_text("")
    (tmp_path / "src/tfshards/a.py").write_text("")
    (tmp_path / "src/tfshards/b.py").write_text("from tfshards import a\n")
    (tmp_path / "src/tfshards/c.py").write_text("")
    (tmp_path / "stages/run.py").write_text("from tfshards.b import x\n")
    dvc_yaml = tmp_path / "dvc.yaml"
    dvc_yaml.write_text(
        "stages:\n"
        "  one:\n"
        "    cmd: python stages/run.py\n"
        "    deps:\n"
        "      - stages/run.py\n"
        "      - src/tfshards/b.py\n"
        "      - src/tfshards/c.py\n"
        "      - data/raw\n"
    )
    return dvc_yaml


def test_a_stray_and_a_missing_dep_are_found_and_fixed(tmp_path):
    dvc_yaml = _planted(tmp_path)
    assert check(dvc_yaml) == {"one": (["src/tfshards/a.py"], ["src/tfshards/c.py"])}
    assert fix(dvc_yaml)
    assert check(dvc_yaml) == {"one": ([], [])}
    deps = yaml.safe_load(dvc_yaml.read_text())["stages"]["one"]["deps"]
    assert deps == ["stages/run.py", "src/tfshards/b.py", "src/tfshards/a.py", "data/raw"]
    assert not fix(dvc_yaml)


def test_fixing_this_repo_changes_nothing(tmp_path):
    copy = tmp_path / "dvc.yaml"
    shutil.copy(REPO / "dvc.yaml", copy)
    (tmp_path / "src").symlink_to(REPO / "src")
    (tmp_path / "stages").symlink_to(REPO / "stages")
    assert not fix(copy), "dvc.yaml's deps are out of date: run `make deps`"
