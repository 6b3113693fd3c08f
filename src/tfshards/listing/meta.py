"""``meta.json``: what a listing directory says of itself, read and checked without its entries.

Written last by :func:`tfshards.listing.listing.write_listing`, with the
count, byte total, labels and SHA-256 of ``files.jsonl``, so a reader that
finds both consistent knows neither is stale or truncated.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from tfshards import storage
from tfshards.errors import ConfigError, InputError
from tfshards.format.columns import Column, columns_json, parse_columns

VERSION = 2  # 2: tokens name the content (sha256 or the storage's hash), never an mtime
FILES_NAME = "files.jsonl"
META_NAME = "meta.json"


def meta_doc(
    root: str,
    labels: Sequence[str],
    total_bytes: int,
    files_per_label: Mapping[str, int],
    skipped: Mapping[str, int],
    digest: str,
    columns: Sequence[Column] = (),
) -> dict[str, Any]:
    """``meta.json``'s document: the listing's counts, labels and the SHA-256 of its lines.

    ``columns``: the index file's extra columns, under ``columns`` (absent without).
    """
    doc: dict[str, Any] = {
        "version": VERSION,
        "root": root,
        "labels": list(labels),
        "files": sum(files_per_label.values()),
        "bytes": total_bytes,
        "files_per_label": dict(files_per_label),
        "skipped": dict(skipped),
        "files_sha256": digest,
    }
    if columns:  # absent otherwise: listings without columns keep their bytes
        doc["columns"] = columns_json(columns)
    return doc


def meta_columns(meta: Mapping[str, Any], path: str) -> tuple[Column, ...]:
    """The extra columns ``meta.json`` (at ``path``) declares; InputError when malformed."""
    try:
        return parse_columns(meta.get("columns"))
    except ConfigError as exc:
        raise InputError(f"{path}: {exc}", path=path) from None


def listing_root(out_dir: str) -> str:
    """The ``root`` a listing directory names, read from ``meta.json`` alone."""
    fs, base = storage.open_url(out_dir)
    root: str = read_meta(fs, base)[0]["root"]
    return storage.resolve_relative(root, out_dir)


def listing_counts(out_dir: str) -> tuple[int, int]:
    """``(files, bytes)`` of a listing directory, read from ``meta.json`` alone."""
    fs, base = storage.open_url(out_dir)
    meta = read_meta(fs, base)[0]
    return int(meta["files"]), int(meta["bytes"])


def read_meta(fs: Any, base: str) -> tuple[dict[str, Any], str]:
    """``meta.json`` of the listing directory ``base``, checked, and its URL (for messages)."""
    fs_path = storage.join(base, META_NAME)
    path = storage.unstrip(fs, fs_path)
    try:
        meta = json.loads(storage.read_bytes(fs, fs_path))
    except FileNotFoundError:
        raise InputError(
            f"{path}: listing metadata not found (run `tfshards list` first)", path=path
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(
            f"{path}: expected a JSON object, found invalid JSON ({exc})", path=path
        ) from None
    except RecursionError:  # arrays or objects nested ~1,000 deep
        raise InputError(
            f"{path}: expected a JSON object, found values nested too deep to read", path=path
        ) from None
    expected = {
        "version": int,
        "root": str,
        "labels": list,
        "files": int,
        "bytes": int,
        "files_per_label": dict,
        "skipped": dict,
        "files_sha256": str,
    }
    if not isinstance(meta, dict):
        raise InputError(f"{path}: expected a JSON object, found {type(meta).__name__}", path=path)
    for key, kind in expected.items():
        if not isinstance(meta.get(key), kind):
            found = type(meta[key]).__name__ if key in meta else "nothing"
            raise InputError(
                f"{path}: key {key!r}: expected {kind.__name__}, found {found}", path=path
            )
    if meta["version"] != VERSION:
        raise InputError(
            f"{path}: listing version {VERSION} expected, found {meta['version']}", path=path
        )
    if not all(isinstance(label, str) for label in meta["labels"]):
        raise InputError(f"{path}: labels must all be strings", path=path)
    return meta, path
