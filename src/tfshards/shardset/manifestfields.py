"""Check a manifest document's fields one by one, before anything trusts them.

Readers join each shard name (and each metadata path) to the version
directory and open it; the label names say what every record's ``label``
means. A hand-edited, truncated or hostile manifest must therefore fail on
load, in one line naming the manifest, the field, what was expected and what
was found: never open a file outside the version directory, read a shard
twice, or hand out another label's name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tfshards.errors import InputError
from tfshards.format.wire import COMPRESSIONS
from tfshards.shardset.layout import SHARD_NAME, shard_name

MISSING: Any = object()  # what ``get`` gives for an absent key: shown as "nothing"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_FINGERPRINT = re.compile(r"[0-9a-f]{16}")  # tfshards.writing.plan.fingerprint
_SHOWN = 120  # characters of a found value in a message: a 10k-label list stays one short line

# name, records, bytes, sha256, index sha256, bucket, records sha256
ShardFields = tuple[str, int, int, str, str | None, int | None, str | None]


def get(doc: Mapping[str, Any], key: str) -> Any:
    return doc.get(key, MISSING)


def bad(source: str, where: str, expected: str, found: Any) -> InputError:
    """The one-line error for field ``where`` of the manifest ``source``."""
    shown = "nothing" if found is MISSING else repr(found)
    if len(shown) > _SHOWN:
        shown = shown[: _SHOWN - 3] + "..."
    return InputError(f"{source}: {where}: expected {expected}, found {shown}", path=source)


def mapping(source: str, where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad(source, where, "an object", value)
    return value


def count(source: str, where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad(source, where, "a non-negative integer", value)
    return value


def text(source: str, where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise bad(source, where, "a string", value)
    return value


def sha256(source: str, where: str, value: Any) -> str:
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise bad(source, where, "a sha256 (64 lowercase hex digits)", value)
    return value


def compression(source: str, value: Any) -> str:
    if value not in COMPRESSIONS:
        raise bad(source, "compression", f"one of {COMPRESSIONS}", value)
    return str(value)


def root(source: str, value: Any, fingerprint: Any) -> tuple[str, str]:
    """``(root, fingerprint)``; the root may be any folder (a copied set names its own)."""
    if not isinstance(fingerprint, str) or not _FINGERPRINT.fullmatch(fingerprint):
        raise bad(source, "fingerprint", "16 lowercase hex digits", fingerprint)
    if not isinstance(value, str) or not value:
        raise bad(source, "root", "the version directory's path or URL", value)
    return value, fingerprint


def base(source: str, value: Any) -> str:
    """The fingerprint of the version a set grew from; empty when written from scratch."""
    if value is MISSING:
        return ""
    if not isinstance(value, str) or not _FINGERPRINT.fullmatch(value):
        raise bad(source, "base", "16 lowercase hex digits", value)
    return value


def changes(source: str, value: Any) -> dict[str, int]:
    """Counts of what changed since the base version; empty when absent."""
    if value is MISSING:
        return {}
    found = mapping(source, "changes", value)
    return {str(k): count(source, f"changes.{k}", n) for k, n in found.items()}


def labels(source: str, value: Any, pinned: Any = None) -> tuple[str, ...]:
    """Label names: a record's ``label`` is a position here, so order is meaning.

    A listing holds its labels unique and sorted (:class:`tfshards.listing.listing.Listing`),
    and the manifest copies them: any other order relabels every record. A set
    written with a pinned label map (``pinned``: ``params["labels"]``) holds that map.
    """
    if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value):
        raise bad(source, "labels", "a list of non-empty strings", value)
    if pinned is not None:
        if value != pinned or len(set(value)) != len(value):
            raise bad(source, "labels", "the unique names of params.labels, in its order", value)
    elif value != sorted(set(value)):
        raise bad(source, "labels", "unique names, sorted as the listing holds them", value)
    return tuple(value)


def shards(source: str, value: Any, prefix: Any) -> tuple[ShardFields, ...]:
    """Each shard's fields; names are the layout's, each listed once.

    Args:
        prefix: ``params["name"]``, the shard name prefix (not a string: any prefix).
    """
    if not isinstance(value, list):
        raise bad(source, "shards", "a list", value)
    seen: dict[str, int] = {}
    out = []
    for i, entry in enumerate(value):
        where = f"shards[{i}]"
        entry = mapping(source, where, entry)
        name = _shard_name(source, f"{where}.name", get(entry, "name"), prefix, len(value))
        if name in seen:
            raise bad(source, f"{where}.name", f"each shard once (shards[{seen[name]}] is)", name)
        seen[name] = i
        index, bucket, members = (
            entry.get(k) for k in ("index_sha256", "bucket", "records_sha256")
        )
        out.append(
            (
                name,
                count(source, f"{where}.records", get(entry, "records")),
                count(source, f"{where}.bytes", get(entry, "bytes")),
                sha256(source, f"{where}.sha256", get(entry, "sha256")),
                None if index is None else sha256(source, f"{where}.index_sha256", index),
                None if bucket is None else count(source, f"{where}.bucket", bucket),
                None if members is None else sha256(source, f"{where}.records_sha256", members),
            )
        )
    return tuple(out)


def _shard_name(source: str, where: str, value: Any, prefix: Any, total: int) -> str:
    if not isinstance(value, str) or "/" in value or "\\" in value or value in ("", ".", ".."):
        raise bad(source, where, "a plain file name inside the version directory", value)
    pattern = f"{prefix if isinstance(prefix, str) else '<name>'}-NNNNN-of-{total:05d}.tfrecord"
    found = SHARD_NAME.fullmatch(value)
    if (
        found is None
        or (isinstance(prefix, str) and found["prefix"] != prefix)
        or not int(found["index"]) < int(found["count"]) == total
        or value != shard_name(found["prefix"], int(found["index"]), total)
    ):
        raise bad(source, where, f"a shard name {pattern} (NNNNN below {total})", value)
    return value


def metadata_files(source: str, value: Any) -> dict[str, str]:
    """Other files of the version directory: paths inside it, and their sha256."""
    if value is MISSING:
        return {}
    out = {}
    for rel, digest in mapping(source, "metadata_files", value).items():
        parts = rel.split("/")
        if "\\" in rel or any(part in ("", ".", "..") for part in parts):
            raise bad(source, "metadata_files", "paths inside the version directory", rel)
        out[rel] = sha256(source, f"metadata_files[{rel!r}]", digest)
    return out


def rejected(source: str, value: Any) -> tuple[tuple[str, str, str], ...]:
    if not isinstance(value, list):
        raise bad(source, "rejected", "a list", value)
    out = []
    for i, entry in enumerate(value):
        entry = mapping(source, f"rejected[{i}]", entry)
        path = text(source, f"rejected[{i}].path", get(entry, "path"))
        reason = text(source, f"rejected[{i}].reason", get(entry, "reason"))
        token = text(source, f"rejected[{i}].token", entry["token"]) if "token" in entry else ""
        out.append((path, reason, token))
    return tuple(out)
