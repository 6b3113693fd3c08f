"""Round-trip YAML files (comments, order and quoting kept): load, build nodes, fold, save.

A loaded file is refused in one line when it is not UTF-8, nests deeper than
the parser can follow, holds a recursive alias (ruamel writes it back as
``null``) or aliases that expand it many times over (a "billion laughs"). A
save keeps what the file was: a symlink is written through to its target,
the permission bits stay, and the new bytes are fsynced before the rename.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fsspec.implementations.local import LocalFileSystem
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.constructor import RoundTripConstructor
from ruamel.yaml.error import YAMLError
from ruamel.yaml.nodes import CollectionNode, MappingNode, Node, ScalarNode, SequenceNode
from ruamel.yaml.scalarstring import FoldedScalarString

from tfshards import atomicfile, storage
from tfshards.errors import ConfigError

FOLD_AT = 88  # fold long commands into `>-` blocks of lines about this long
_LOCAL = LocalFileSystem()


def plain(value: Any) -> Any:
    """Loaded YAML as plain dicts, lists and scalars; commands with whitespace collapsed."""
    if isinstance(value, Mapping):
        return {
            str(k): " ".join(str(v).split()) if k == "cmd" else plain(v) for k, v in value.items()
        }
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def to_yaml(value: Any, comments: Mapping[str, str] | None = None) -> Any:
    """Plain data as round-trip YAML nodes: long commands folded, comments beside keys."""
    if isinstance(value, Mapping):
        node = CommentedMap()
        for key, item in value.items():
            node[key] = fold(item) if key == "cmd" else to_yaml(item)
        if comments:  # aligned one column past the longest `key: value` line
            column = 4 + max(len(f"{k}: {_scalar(v)}") for k, v in value.items())
            for key, comment in comments.items():
                if key in node:
                    node.yaml_add_eol_comment(comment, key, column=column)
        return node
    if isinstance(value, list):
        return CommentedSeq(to_yaml(v) for v in value)
    return value


def _scalar(value: Any) -> str:
    """How a params scalar prints in YAML (for aligning comments)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def fold(cmd: str) -> str:
    """A ``>-`` block scalar, folded before options so lines stay within :data:`FOLD_AT`."""
    if len(cmd) <= FOLD_AT:
        return cmd
    folded = FoldedScalarString(cmd)
    positions, line_start, last_option = [], 0, None
    for i in range(len(cmd)):
        if not cmd.startswith(" --", i):
            continue
        if i - line_start > FOLD_AT and last_option is not None:
            positions.append(last_option)
            line_start = last_option + 1
        last_option = i
    if len(cmd) - line_start > FOLD_AT and last_option is not None and last_option > line_start:
        positions.append(last_option)
    folded.fold_pos = positions  # where ruamel breaks the line (a space there)
    text: str = folded
    return text


def _yaml() -> YAML:
    yaml = YAML()  # round trip: comments, order and quoting survive
    yaml.Constructor = _CheckedConstructor
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = 4096  # folding is ours (fold); never re-wrap a user's long lines
    return yaml


# Aliases may expand a document past this many nodes only if that is also within this
# many times its own count of nodes. A 550-byte "billion laughs" (10 levels of 9 aliases)
# expands to 4.4e9 nodes: init, once such a value reached a comparison, held 6.5 GB
# after 9 minutes and was still running. plain() takes ~0.3 s per 100k expanded nodes
# (320k in 0.91 s on the shared 2-core dev box), so the budget bounds that at a second.
ALIAS_BUDGET = 100_000
ALIAS_AMPLIFICATION = 10


def load(path: Path) -> CommentedMap:
    """A YAML mapping file as round-trip nodes; an empty mapping when it does not exist."""
    data = _read(path)
    if data is None:
        return CommentedMap()
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path}: expected UTF-8 text, found byte {data[exc.start]:#04x} at offset "
            f"{exc.start} (line {line}); save the file as UTF-8",
            path=str(path),
        ) from None
    return parse(text, str(path))


def parse(text: str, path: str) -> CommentedMap:
    """YAML mapping ``text`` (from ``path``, named in errors) as round-trip nodes."""
    try:
        document = _yaml().load(text)
    except _Refused as exc:
        raise ConfigError(f"{path}: {exc}", path=str(path)) from None
    except YAMLError as exc:
        problem = " ".join(str(exc).split())
        raise ConfigError(f"{path}: not valid YAML: {problem}", path=str(path)) from None
    except RecursionError:  # ruamel composes recursively: 300 nested lists reach the limit
        raise ConfigError(
            f"{path}: nested too deeply for the YAML parser (Python's recursion limit)",
            path=str(path),
        ) from None
    if document is None:
        return CommentedMap()
    if not isinstance(document, CommentedMap):
        raise ConfigError(f"{path}: expected a YAML mapping, found {type(document).__name__}")
    return document


def _read(path: Path) -> bytes | None:
    """The bytes of ``path`` (following a symlink); None when there is no file at all."""
    if not os.path.lexists(path):
        return None
    if path.is_symlink() and not path.exists():
        raise ConfigError(
            f"{path}: a symlink to {os.path.realpath(path)}, which does not exist: "
            "create it, or remove the link",
            path=str(path),
        )
    try:
        fd = storage.open_regular(str(path))  # a FIFO would block the read forever
    except storage.NotAFileError as exc:
        raise ConfigError(f"{path}: {exc.strerror}", path=str(path)) from None
    try:
        return storage.read_rest(fd)
    finally:
        os.close(fd)


def _entries(node: Any) -> list[Any]:
    """The keys and values of a mapping, the items of a list; nothing under a scalar."""
    if isinstance(node, dict):  # the stored entries: ruamel's getitem is 5x slower
        return [*dict.keys(node), *dict.values(node)]
    return list(node) if isinstance(node, list) else []


def _children(node: Any) -> list[Any]:
    """The mappings and lists directly under ``node`` (keys too: a key may be a mapping)."""
    return [item for item in _entries(node) if isinstance(item, dict | list)]


def anchor(node: Any) -> str | None:
    """The anchor name a loaded mapping or list carries, if any."""
    found = getattr(node, "yaml_anchor", lambda: None)()
    return None if found is None else str(found.value)


class _Refused(Exception):
    """A parsed document the loader will not build (load adds the file's name)."""


def _node_entries(node: Node) -> list[Node]:
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value) if isinstance(node, SequenceNode) else []


def check_aliases(root: Node) -> None:
    """Refuse a recursive alias, or aliases that expand a parsed document past the budget.

    Runs on the parsed nodes, before any value is built: ruamel builds a
    recursive alias as ``null``, so afterwards it cannot be seen. One pass over
    the distinct nodes (an alias is visited once, never expanded), so a bomb
    costs what its text costs.

    Raises:
        _Refused: what is wrong, in one line.
    """
    size: dict[int, int] = {}  # expanded node count under each distinct mapping or list
    distinct = 0  # nodes as written: each mapping and list once, with its scalars
    open_nodes: set[int] = set()
    stack: list[tuple[Node, list[Node] | None]] = [(root, None)]
    while stack:
        node, entries = stack.pop()
        if entries is not None:  # everything under it is counted: count it
            open_nodes.discard(id(node))
            size[id(node)] = 1 + sum(size.get(id(e), 1) for e in entries)
            distinct += 1 + sum(isinstance(e, ScalarNode) for e in entries)
            continue
        if id(node) in size:
            continue
        if id(node) in open_nodes:  # reached again from inside itself
            raise _Refused(
                f"anchor &{node.anchor} contains an alias of itself; a recursive value "
                f"cannot be written back: replace the alias *{node.anchor} inside it"
            )
        entries = _node_entries(node)
        open_nodes.add(id(node))
        stack.append((node, entries))
        stack.extend((e, None) for e in entries if isinstance(e, CollectionNode))
    expanded = size.get(id(root), 1)
    if expanded > ALIAS_BUDGET and expanded > ALIAS_AMPLIFICATION * distinct:
        raise _Refused(
            f"aliases expand its {distinct} nodes to {expanded} (refused past "
            f"{ALIAS_BUDGET} and {ALIAS_AMPLIFICATION}x its size): expand fewer aliases"
        )


class _CheckedConstructor(RoundTripConstructor):
    """ruamel's round-trip constructor, refusing what :func:`check_aliases` refuses."""

    def construct_document(self, node: Any) -> Any:
        check_aliases(node)
        return super().construct_document(node)


def references(document: Any, node: Any) -> int:
    """How many places of ``document`` hold ``node`` (more than 1: it is shared by aliases)."""
    count, seen, stack = 0, set(), [document]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        children = _children(current)
        count += sum(child is node for child in children)
        stack.extend(children)
    return count


def dump(document: CommentedMap) -> str:
    stream = io.StringIO()
    _yaml().dump(document, stream)
    return stream.getvalue()


def target(path: Path) -> Path:
    """The file a save of ``path`` replaces: ``path``, or the file its symlink points to.

    A symlink is written through (the link stays, pointing where it did). A file
    with other hard links is refused: the rename would leave them the old bytes.
    """
    real = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        links = os.stat(real).st_nlink
    except FileNotFoundError:
        return real
    if links > 1:
        raise ConfigError(
            f"{path}: expected 1 link to the file, found {links} (hard links); tfshards "
            "replaces the file by a rename, which would leave the others the old content: "
            "make it a copy or a symlink",
            path=str(path),
        )
    return real


def save(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically and durably, keeping its permission bits.

    A temp file beside the target, fsynced, renamed over it, then the folder
    fsynced (:func:`tfshards.atomicfile.write_atomic`).
    """
    real = target(path)
    try:
        mode: int | None = stat.S_IMODE(os.stat(real).st_mode)
    except FileNotFoundError:
        mode = None
    atomicfile.write_atomic(_LOCAL, str(real), [text.encode()], mode=mode)
