"""A shard's member list: each record's listed path, content token and label id, in order.

One compact JSON array per line (``["cats/1.png","sha256:ab..",0]``), UTF-8,
written beside each shard (:data:`tfshards.shardset.layout.RECORDS`) with its
sha256 in the manifest. A later version decides from these lists alone which
shards it can reuse byte for byte, and ``tfshards diff`` compares two versions
with them, without reading a record.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from tfshards import storage
from tfshards.errors import InputError
from tfshards.shardset import layout


class Member(NamedTuple):
    """One record of a shard, as its listing named it."""

    path: str  # relative to the listing's root
    token: str  # content token (tfshards.listing.contenthash)
    label: int  # label id in the manifest's labels


def encode(members: Iterable[tuple[str, str, int]]) -> bytes:
    """The member list's bytes: one array per line, in record order."""
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    return "".join(dumps([path, token, label]) + "\n" for path, token, label in members).encode()


def decode(data: bytes, source: str) -> Iterator[Member]:
    """The members of ``data``; ``source`` names the file in an error.

    Raises:
        InputError: a line that is not ``[path, token, label id]`` (one line, with its number).
    """
    for number, line in enumerate(data.splitlines(), 1):
        try:
            path, token, label = json.loads(line)
        except (ValueError, TypeError):
            path = None
        if not (isinstance(path, str) and isinstance(token, str) and _is_id(label)):
            raise InputError(
                f"{source}: line {number}: expected [path, token, label id], found {line[:80]!r}",
                path=source,
            )
        yield Member(path, token, label)


def read(fs: Any, version: str, shard: str) -> list[Member]:
    """The members of ``shard`` in the version directory ``version`` on ``fs``.

    Raises:
        InputError: the file is missing or malformed.
    """
    path = layout.records_path(version, shard)
    try:
        data = storage.read_bytes(fs, path)
    except FileNotFoundError:
        raise InputError(
            f"{storage.unstrip(fs, path)}: member list not found (every shard written since "
            "split buckets has one)",
            path=path,
        ) from None
    return list(decode(data, storage.unstrip(fs, path)))


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
