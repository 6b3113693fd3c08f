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
from typing import Any

from tfshards import atomicfile, storage


def encode(doc: Any, *, indent: int | None = 2, sort_keys: bool = True) -> bytes:
    """``doc`` as the bytes of a JSON file: keys sorted, UTF-8 kept, one final newline."""
    return (json.dumps(doc, sort_keys=sort_keys, indent=indent, ensure_ascii=False) + "\n").encode()


def digest(doc: Any) -> str:
    """The SHA-256 (hex) of ``doc`` as compact sorted ASCII JSON; non-JSON values as ``str``."""
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def save(doc: Any, url: str) -> None:
    """Write ``doc`` to ``url`` (a local path or fsspec URL) as a JSON file, atomically."""
    fs, path = storage.open_url(url)
    atomicfile.write_atomic(fs, path, [encode(doc)])


def save_metrics(doc: Any, url: str) -> None:
    """:func:`save` for a DVC metrics file: keys in the order the code gives them.

    ``dvc exp show`` and ``dvc metrics show`` list a file's keys in its order,
    so each stage puts the numbers a user compares first (``val_accuracy``,
    ``ok``) at the front. The order is fixed in code: the same bytes every run.
    """
    fs, path = storage.open_url(url)
    atomicfile.write_atomic(fs, path, [encode(doc, sort_keys=False)])
