"""The block tfshards keeps in a repository's ``.gitignore``: raw data, the stages' outputs
and checkpoints stay out.

Raw images belong to DVC (``dvc add data/raw``), never to git: without this, the
first ``git add -A`` after ``tfshards init`` committed every image. The stages'
cached outputs (the listing, the manifest, local shards) are DVC's too: DVC
ignores each when its stage runs, but a first ``dvc repro`` that stopped at
``write`` left the listing unignored, ``git add -A`` committed it, and every
later ``dvc repro`` failed ("output 'data/listing' is already tracked by SCM").
Training checkpoints are scratch that a killed run leaves behind, and so is the
page ``dvc plots show`` writes (``dvc_plots/``, which the docs have a user run
before ``git add -A``). ``tfshards init`` writes these lines between two marker
comments and only ever rewrites that block; every other line of the file stays as
it was.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from pathlib import Path

from tfshards.errors import ConfigError
from tfshards.project import yamlfile
from tfshards.project.pipeline import CHECKPOINTS
from tfshards.storage import split_protocol

BEGIN = "# >>> tfshards init: raw data is tracked by DVC, checkpoints are scratch"
END = "# <<< tfshards init"
DVC_PLOTS = "dvc_plots"  # where `dvc plots show` writes its page by default


def wanted(root: str, outs: Sequence[str] = ()) -> list[str]:
    """The lines to keep ignored: the raw root and each of ``outs`` (a folder when it ends
    with ``/``) that is a path inside the repository, then the checkpoints and DVC's
    plots page."""
    lines = []
    for where in (f"{root.rstrip('/')}/", *outs):
        protocol, path = split_protocol(where)
        rel = posixpath.normpath(str(path))
        if protocol is None and not posixpath.isabs(rel) and not rel.startswith(".."):
            lines.append(f"/{rel}/" if where.endswith("/") else f"/{rel}")
    lines.append(f"/{CHECKPOINTS.split('/')[0]}/")
    lines.append(f"/{DVC_PLOTS}/")
    return lines


def merge(text: str, lines: list[str]) -> str:
    """``text`` with its tfshards block holding ``lines`` (appended when it has none)."""
    block = [BEGIN, *lines, END]
    rows = text.splitlines()
    if BEGIN in rows and END in rows[rows.index(BEGIN) :]:
        start = rows.index(BEGIN)
        end = rows.index(END, start)
        rows[start : end + 1] = block
    else:
        rows += ([""] if rows and rows[-1].strip() else []) + block
    return "\n".join(rows) + "\n"


def update(directory: Path, root: str, outs: Sequence[str] = ()) -> bool:
    """Write the block (:func:`wanted`) into ``directory/.gitignore``; True when it changed.

    Raises:
        ConfigError: the file is not UTF-8 text (named with the byte offset).
    """
    path = directory / ".gitignore"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = b""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: expected UTF-8 text, found byte {data[exc.start]:#04x} at offset "
            f"{exc.start}; save the file as UTF-8",
            path=str(path),
        ) from None
    new = merge(text, wanted(root, outs))
    if new == text:
        return False
    yamlfile.save(path, new)
    return True
