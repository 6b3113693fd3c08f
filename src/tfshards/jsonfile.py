"""Canonical JSON: the one way tfshards writes a JSON file, and hashes a JSON document.

Files (manifest, listing meta, splits, sidecars) are sorted-key JSON in
UTF-8 with a final newline (a metrics file keeps the key order its stage
gives), so the same document is the same bytes on every machine and a diff
of two runs shows only what changed. Hashes (the version
name, a training run's settings key) use the compact ASCII form, which is what
the version names written so far were computed from.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tfshards import atomicfile, storage
from tfshards.errors import ConfigError


def encode(doc: Any, *, indent: int | None = 2, sort_keys: bool = True) -> bytes:
    """``doc`` as the bytes of a JSON file: keys sorted, UTF-8 kept, one final newline."""
    return (json.dumps(doc, sort_keys=sort_keys, indent=indent, ensure_ascii=False) + "\n").encode()


def digest(doc: Any) -> str:
    """The SHA-256 (hex) of ``doc`` as compact sorted ASCII JSON; non-JSON values as ``str``."""
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class Output:
    """A JSON file a command writes: ``doc`` at ``url``; ``like``: what a file of this kind
    holds when ``doc`` is empty (a side with no records); ``ordered``: keys in ``doc``'s
    order (a metrics file, :func:`save_metrics`), else sorted."""

    doc: Any
    url: str
    like: Any = None
    ordered: bool = False


def save_outputs(outputs: Sequence[Output]) -> None:
    """Write every output, each atomically, once every one is known replaceable
    (:func:`check_replaceable`): a refusal of the last wrote the first ones before."""
    opened = [(storage.open_url(o.url), o) for o in outputs]
    for (fs, path), o in opened:
        check_replaceable(fs, path, o.doc, o.like)
    for (fs, path), o in opened:
        atomicfile.write_atomic(fs, path, [encode(o.doc, sort_keys=not o.ordered)])


def save(doc: Any, url: str) -> None:
    """Write ``doc`` to ``url`` (a local path or fsspec URL) as a JSON file, atomically,
    where no file is or one like it (:func:`check_replaceable`)."""
    save_outputs([Output(doc, url)])


def save_metrics(doc: Any, url: str) -> None:
    """:func:`save` for a DVC metrics file: keys in the order the code gives them.

    ``dvc exp show`` and ``dvc metrics show`` list a file's keys in its order,
    so each stage puts the numbers a user compares first (``val_accuracy``,
    ``ok``) at the front. The order is fixed in code: the same bytes every run.
    """
    save_outputs([Output(doc, url, ordered=True)])


_LARGEST = 64 << 20  # bytes of an existing file read to tell whether it is one of these


def check_replaceable(fs: Any, path: str, doc: Any, like: Any = None) -> None:
    """Refuse to replace a file at ``path`` that is not this kind of JSON file
    (:func:`_unlike`), never a manifest or a listing's ``meta.json``. A user's notes,
    another tool's JSON or the manifest itself given as a --metrics was replaced.

    Raises:
        ConfigError: one line naming the file and what it holds.
    """
    if not fs.exists(path):
        return
    found = _what_is_there(fs, path, doc if doc or like is None else like)
    if found:
        where = storage.unstrip(fs, path)
        raise ConfigError(
            f"{where}: expected a new file or a JSON file tfshards wrote there before, found "
            f"{found}: pass another path or remove it",
            path=where,
        )


def _what_is_there(fs: Any, path: str, doc: Any) -> str:
    """What makes the file at ``path`` not one to replace with ``doc`` ("" when none)."""
    if fs.isdir(path):
        return "a folder"
    size = fs.size(path)
    if size > _LARGEST:
        return f"a file of {size} bytes"
    try:
        old = json.loads(storage.read_bytes(fs, path))
    except (ValueError, RecursionError):
        return "a file that is not JSON"
    return _unlike(old, doc)


def _unlike(old: Any, doc: Any) -> str:
    """How the JSON value ``old`` is not one like ``doc`` ("" when it is): an object most
    of whose keys ``doc`` has, or which has every key of ``doc`` (a check that knows only
    the keys a run surely writes); a list whose first item is like ``doc``'s (a user's
    list of words was taken for one of rows); an empty one of either."""
    if type(old) is not type(doc) or not isinstance(doc, (dict, list)):
        return f"JSON of another kind ({type(old).__name__})"
    if isinstance(old, list):
        if old and not doc:  # nothing to tell rows by: only an empty list is one's own
            return "a list of other rows"
        return _unlike(old[0], doc[0]) if old and doc else ""
    if _OWN_KEYS.issubset(old) or "files_sha256" in old:
        return "a shard set's manifest" if "shards" in old else "a listing's meta.json"
    if old and not doc:  # nothing to tell keys by: only an empty object is one's own
        return f"JSON with other keys (first: {sorted(old)[0]!r})"
    shared = set(old) & set(doc)
    if old and 2 * len(shared) < len(old) and not set(doc) <= set(old):
        return f"JSON with other keys ({len(old) - len(shared)} of {len(old)} are not its own)"
    return ""


_OWN_KEYS = frozenset({"fingerprint", "shards"})  # a manifest's: never a command's output
