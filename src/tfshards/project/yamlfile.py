"""Round-trip YAML files (comments, order and quoting kept): load, build nodes, fold, save."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError
from ruamel.yaml.scalarstring import FoldedScalarString

from tfshards.errors import ConfigError

FOLD_AT = 88  # fold long commands into `>-` blocks of lines about this long


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
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = 4096  # folding is ours (fold); never re-wrap a user's long lines
    return yaml


def load(path: Path) -> CommentedMap:
    """A YAML mapping file as round-trip nodes; an empty mapping when it does not exist."""
    if not path.exists():
        return CommentedMap()
    try:
        document = _yaml().load(path.read_text())
    except YAMLError as exc:
        problem = " ".join(str(exc).split())
        raise ConfigError(f"{path}: not valid YAML: {problem}", path=str(path)) from None
    if document is None:
        return CommentedMap()
    if not isinstance(document, CommentedMap):
        raise ConfigError(f"{path}: expected a YAML mapping, found {type(document).__name__}")
    return document


def dump(document: CommentedMap) -> str:
    stream = io.StringIO()
    _yaml().dump(document, stream)
    return stream.getvalue()


def save(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (a temp file beside it, then a rename)."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(text)
    os.replace(temp, path)
