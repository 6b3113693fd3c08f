"""Which package modules each module of a source tree imports, read with ``ast`` (nothing runs).

An edge is an import statement at the top of a module or inside a function
(bodies of ``if TYPE_CHECKING:`` never run and are skipped), resolved to the
module it loads: ``from tfshards import storage`` and ``from . import storage``
both give ``tfshards.storage``. A string ``"tfshards.mod:Name"`` is a *named*
edge: a registry that imports the module on first use (``run.executor``'s
built-in executors). It is a dependency like any other, except that it forms
no circle at import time.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

NAMED = re.compile(r"^([A-Za-z_][\w.]*):[A-Za-z_]\w*$")  # "package.module:Name"


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``line`` (``named``: by a registry string)."""

    source: str
    target: str
    line: int
    named: bool = False


def module_name(path: Path, root: Path) -> str:
    """``root/tfshards/run/executor.py`` -> ``tfshards.run.executor`` (a package: its name)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path, package: str = "tfshards") -> dict[str, Path]:
    """Every module of ``package`` under ``root``, by dotted name."""
    return {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}


def runtime_nodes(tree: ast.AST) -> list[ast.AST]:
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


def _base(name: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` reads from (relative ones resolved)."""
    if not node.level:
        return node.module or ""
    parts = name.split(".") if is_package else name.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, *([node.module] if node.module else [])])


def edges(name: str, path: Path, known: set[str], package: str = "tfshards") -> list[Edge]:
    """What module ``name`` (file ``path``) imports from ``package`` when it runs."""
    found: list[Edge] = []
    inside = (package, f"{package}.")

    def add(target: str, line: int, named: bool = False) -> None:
        if target == package or target.startswith(inside[1]):
            found.append(Edge(name, target, line, named))

    for node in runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _base(name, path.name == "__init__.py", node)
            for alias in node.names:  # `from tfshards import storage` imports a module
                full = f"{base}.{alias.name}"
                add(full if full in known else base, node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = NAMED.match(node.value)
            if match and match[1] in known:
                add(match[1], node.lineno, named=True)
    return sorted(set(found), key=lambda e: (e.line, e.target))


def graph(root: Path, package: str = "tfshards") -> dict[str, list[Edge]]:
    """Every module of ``package`` under ``root`` and the edges out of it."""
    found = modules(root, package)
    return {name: edges(name, path, set(found), package) for name, path in found.items()}


def closure(starts: set[str], imports: dict[str, list[Edge]]) -> set[str]:
    """Every module importing ``starts`` loads: their imports, transitively.

    A package's ``__init__`` counts only where it is imported by name: the wings'
    hold only ``__all__``, and ``tfshards.cli``'s (the command's app) is the top.
    """
    seen: set[str] = set()
    todo = list(starts)
    while todo:
        name = todo.pop()
        if name in seen or name not in imports:
            continue
        seen.add(name)
        todo += [e.target for e in imports[name]]
    return seen
