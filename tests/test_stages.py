"""dvc.yaml's stage declarations: every library module a stage runs is one of its deps."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` (never run)."""
    nodes, todo = [], [tree]
    while todo:
        node = todo.pop()
        nodes.append(node)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            todo += node.orelse
            continue
        todo += ast.iter_child_nodes(node)
    return nodes


def _imports(path: Path) -> set[str]:
    """tfshards modules ``path`` imports when it runs, at the top or inside functions."""
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("tfshards")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfshards"):
            module = node.module or ""
            found.add(module)
            for alias in node.names:  # `from tfshards import storage` imports a module
                if (SRC / module.replace(".", "/") / f"{alias.name}.py").exists():
                    found.add(f"{module}.{alias.name}")
    return found


def _module_file(module: str) -> Path:
    base = SRC / module.replace(".", "/")
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _closure(script: Path) -> set[str]:
    """Source files (repo-relative) of every tfshards module ``script`` can import."""
    seen: set[str] = set()
    todo = list(_imports(script))
    while todo:
        module = todo.pop()
        if module in seen or not _module_file(module).exists():
            continue
        seen.add(module)
        todo += _imports(_module_file(module))
    files = {_module_file(m).relative_to(REPO).as_posix() for m in seen}
    files |= {c for f in files for c in COMPILED.get(f, ())}
    return {f for f in files if not f.endswith("__init__.py")}  # re-exports only


# Modules that load a compiled extension, and its C sources and headers (a change there
# can change bytes): every file setup.py compiles for tfshards.format._native.
COMPILED = {
    "src/tfshards/format/native.py": sorted(
        p.relative_to(REPO).as_posix() for p in (SRC / "tfshards/format").glob("_native*.[ch]")
    )
}


STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_imported_library_module_is_a_dep(name):
    stage = STAGES[name]
    script = re.search(r"python (stages/\S+\.py)", stage["cmd"])
    assert script, f"{name}: cmd runs no stages/*.py script"
    deps = set(stage["deps"])
    assert script[1] in deps
    missing = sorted(_closure(REPO / script[1]) - deps)
    assert not missing, f"stage {name}: add to deps: {missing}"
