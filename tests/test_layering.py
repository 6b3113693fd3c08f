"""The import direction of ``tfshards``: wings (subpackages, top-level modules) in ranks.

A module imports only from a lower rank or its own wing; no two modules import
each other through any chain; a wing's module imported from outside it is one
its ``__init__.py`` names in ``__all__``. Read statically (``importgraph``).
"""

from __future__ import annotations

import ast
import functools
import shutil
from pathlib import Path

import pytest

from importgraph import Edge, graph

SRC = Path(__file__).resolve().parents[1] / "src"

# Bottom to top. A rank's wings never import one another; a lettered rank sits on
# the one before it because of a real import (the comment names it).
RANKS: list[tuple[str, tuple[str, ...]]] = [
    (
        "0a",
        (
            "tfshards._version",
            "tfshards.errors",
            "tfshards.progress",
            "tfshards.summary",
            "tfshards.processes",
            "tfshards.option",
            "tfshards.cachedir",
            "tfshards.heavyimport",
        ),
    ),
    ("0b", ("tfshards.storage",)),  # raises errors' InputError/ShardError
    ("0c", ("tfshards.atomicfile",)),  # publishes through storage's filesystems
    ("0d", ("tfshards.jsonfile",)),  # writes through atomicfile
    ("1a", ("tfshards.format",)),
    ("1b", ("tfshards.run",)),  # the Dask probe reports each worker's format.native
    ("2", ("tfshards.listing",)),
    ("3", ("tfshards.shardset",)),
    ("4a", ("tfshards.writing", "tfshards.validation")),
    ("4b", ("tfshards.reading",)),  # corruption pinpoints a bad record with validation's check
    ("5", ("tfshards.training",)),
    ("6", ("tfshards.project",)),
    ("7a", ("tfshards.cli", "tfshards")),  # tfshards: the package root's __init__
    ("7b", ("tfshards.__main__",)),  # runs cli's main
]
RANK = {wing: (i, label) for i, (label, wings) in enumerate(RANKS) for wing in wings}


def wing_of(module: str) -> str:
    """The wing a module belongs to: its subpackage, or itself when top-level."""
    parts = module.split(".")
    return ".".join(parts[:2])


def rank_errors(imports: dict[str, list[Edge]]) -> list[str]:
    """Every import from a lower rank to a higher one, or between two wings of one rank."""
    found = []
    for edge in (e for edges in imports.values() for e in edges):
        source, target = wing_of(edge.source), wing_of(edge.target)
        if source == target:
            continue
        (mine, my_label), (theirs, their_label) = RANK[source], RANK[target]
        if theirs >= mine:
            what = "a peer wing of the same rank" if theirs == mine else "a higher rank"
            found.append(
                f"{edge.source} (rank {my_label}, line {edge.line}) imports {edge.target} "
                f"(rank {their_label}): {what}"
            )
    return found


def cycles(imports: dict[str, list[Edge]]) -> list[list[str]]:
    """Import circles (each as the modules around it, first repeated last); named edges
    (registry strings, imported on first use) form none."""
    out = {m: sorted({e.target for e in es if not e.named and e.target in imports} - {m})
           for m, es in imports.items()}  # fmt: skip
    found, state = [], dict.fromkeys(out, 0)  # 0 new, 1 on the path, 2 done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in out[module]:
            if state[target] == 1:
                ring = path[path.index(target) :]
                first = ring.index(min(ring))  # the same circle reads the same from any start
                found.append([*ring[first:], *ring[:first], min(ring)])
            elif state[target] == 0:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(out):
        if state[module] == 0:
            visit(module)
    return found


def declared(root: Path, wing: str) -> list[str] | None:
    """The module names a wing's ``__init__.py`` lists in ``__all__`` (None: no such list)."""
    init = root / wing.replace(".", "/") / "__init__.py"
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    return None


def privacy_errors(root: Path, imports: dict[str, list[Edge]]) -> list[str]:
    """Imports, from outside a wing, of a module its ``__init__.py`` does not list."""
    found = []
    for edge in (e for edges in imports.values() for e in edges):
        wing = wing_of(edge.target)
        if wing == wing_of(edge.source) or wing == edge.target or wing.count(".") != 1:
            continue
        if not (root / wing.replace(".", "/")).is_dir():
            continue  # a top-level module: no wing to hide it
        public = declared(root, wing) or []
        if edge.target.split(".")[2] not in public:
            found.append(
                f"{edge.source} (line {edge.line}) imports {edge.target}, which "
                f"{wing}/__init__.py does not list in __all__ (public: {public})"
            )
    return found


def problems(root: Path) -> list[str]:
    """Everything the rule finds in the ``tfshards`` tree under ``root``."""
    imports = graph(root)
    circles = [f"import circle: {' -> '.join(c)}" for c in cycles(imports)]
    return rank_errors(imports) + circles + privacy_errors(root, imports)


# ----------------------------------------------------------------------------- this tree


@functools.cache
def _this_tree() -> dict[str, list[Edge]]:
    """The import graph of this checkout's ``src`` (~0.8 s), made once for these tests."""
    return graph(SRC)


def test_every_wing_has_a_rank():
    wings = {wing_of(m) for m in _this_tree()}
    assert sorted(wings - set(RANK)) == [], "add the new wing to RANKS"


def test_imports_go_down_the_ranks():
    assert rank_errors(_this_tree()) == []


def test_no_import_circles():
    assert cycles(_this_tree()) == []


def test_only_declared_modules_are_imported_from_outside_their_wing():
    assert privacy_errors(SRC, _this_tree()) == []


def test_wings_declare_their_public_modules_and_nothing_else():
    for wing in sorted({wing_of(m) for m in _this_tree()}):
        package = SRC / wing.replace(".", "/")
        if wing.count(".") != 1 or not package.is_dir() or wing == "tfshards.cli":
            continue  # the root's __all__ is its API; cli's __init__ is the command's app
        public = declared(SRC, wing)
        assert public is not None, f"{wing}/__init__.py: no __all__ of public modules"
        assert all((package / f"{m}.py").exists() for m in public), f"{wing}: {public}"
        body = ast.parse((package / "__init__.py").read_text()).body
        assert not [n for n in body if isinstance(n, ast.Import | ast.ImportFrom)], (
            f"{wing}/__init__.py imports: a wing's package re-exports nothing"
        )


def test_the_package_roots_lazy_names_come_from_public_modules():
    tree = ast.parse((SRC / "tfshards/__init__.py").read_text())
    lazy = next(
        n.value
        for n in tree.body
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "_LAZY"
    )
    for module in set(ast.literal_eval(lazy).values()):
        wing = wing_of(module)
        assert module.split(".")[2] in (declared(SRC, wing) or []), module


# ----------------------------------------------------------------------------- planted trees


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of ``src/tfshards`` to plant bad imports in."""
    shutil.copytree(SRC / "tfshards", tmp_path / "tfshards", ignore=shutil.ignore_patterns("*.so"))
    return tmp_path


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + line + "\n")


def test_an_upward_import_is_named(tree):
    _append(tree / "tfshards/storage.py", "from tfshards.shardset import manifest")
    line = len((tree / "tfshards/storage.py").read_text().splitlines())
    found = problems(tree)
    assert found[0] == (
        f"tfshards.storage (rank 0b, line {line}) "
        "imports tfshards.shardset.manifest (rank 3): a higher rank"
    )
    assert (
        found[1].startswith("import circle: ")
        and "tfshards.storage -> tfshards.shardset.manifest" in found[1]
    )


def test_an_import_between_peers_inside_a_function_is_named(tree):
    _append(
        tree / "tfshards/writing/sharding.py", "def f():\n    from tfshards.validation import rules"
    )
    found = problems(tree)
    assert len(found) == 2  # and rules is not one of validation's public modules
    assert "does not list in __all__" in found[1]
    assert found[0].startswith("tfshards.writing.sharding (rank 4a, line ")
    assert found[0].endswith(
        "imports tfshards.validation.rules (rank 4a): a peer wing of the same rank"
    )


def test_an_import_under_type_checking_is_not_one(tree):
    _append(
        tree / "tfshards/storage.py",
        "if TYPE_CHECKING:\n    from tfshards.shardset import manifest",
    )
    assert problems(tree) == []


def test_a_registry_string_is_an_import_but_forms_no_circle(tree):
    _append(tree / "tfshards/run/executor.py", 'UP = "tfshards.writing.writer:write"')
    _append(tree / "tfshards/run/localexec.py", 'BACK = "tfshards.run.executor:Executor"')
    found = problems(tree)
    assert len(found) == 1
    assert found[0].startswith("tfshards.run.executor (rank 1b, line ")
    assert found[0].endswith("imports tfshards.writing.writer (rank 4a): a higher rank")


def test_a_circle_is_reported_with_its_modules(tree):
    _append(tree / "tfshards/format/wire.py", "from . import tfrecord")
    assert problems(tree) == [
        "import circle: tfshards.format.tfrecord -> tfshards.format.wire"
        " -> tfshards.format.tfrecord"
    ]


def test_an_undeclared_module_imported_from_outside_is_named(tree):
    init = tree / "tfshards/shardset/__init__.py"
    init.write_text(init.read_text().replace('"manifest", ', ""))
    found = problems(tree)
    assert found and all("imports tfshards.shardset.manifest, which" in f for f in found)
