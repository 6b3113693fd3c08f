"""A shard's member list: each record's listed path, content token and label id, in order.

One compact JSON array per line (``["cats/1.png","sha256:ab..",0]``), UTF-8,
written beside each shard (:data:`tfshards.shardset.layout.RECORDS`) with its
sha256 in the manifest. A later version decides from these lists alone which
shards it can reuse byte for byte, and ``tfshards diff`` compares two versions
with them, without reading a record (a set written before member lists has
none: :func:`of_shard` reads the same rows from its records).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from tfshards import storage
from tfshards.errors import InputError
from tfshards.shardset import layout
from tfshards.shardset.manifest import ShardInfo

Row = Sequence[Any]  # [path, token, label id]: a Member, or the list JSON parses to


class Member(NamedTuple):
    """One record of a shard, as its listing named it."""

    path: str  # relative to the listing's root
    token: str  # content token (tfshards.listing.contenthash)
    label: int  # label id in the manifest's labels


def encode(members: Iterable[tuple[str, str, int]]) -> bytes:
    """The member list's bytes: one array per line, in record order."""
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    return "".join(dumps([path, token, label]) + "\n" for path, token, label in members).encode()


def decode(data: bytes, source: str, *, trusted: bool = False) -> list[Row]:
    """The rows of a member list: one ``json.loads`` of the whole file as an array.

    3x faster than a parse line by line (0.15 s against 0.44 s for 100,000
    rows); a file that is not one ``[path, token, label id]`` a line goes to
    that parse, which names the line.

    Raises:
        InputError: a line that is not ``[path, token, label id]`` (one line, with its number).
    """
    body = data.removesuffix(b"\n")
    try:
        rows = json.loads(b"[" + body.replace(b"\n", b",") + b"]")
    except (ValueError, RecursionError):
        rows = None
    lines = body.count(b"\n") + 1 if body else 0
    if rows is None or len(rows) != lines or not (trusted or all(map(_is_row, rows))):
        return list(_by_line(data, source))
    checked: list[Row] = rows
    return checked


# A member line whose strings hold no escaped character: path and token as JSON
# string bytes, the label id; read by one regex pass.
_PLAIN_ROW = re.compile(rb'^\["([^"\\\n]*)","([^"\\\n]*)",(\d+)\]$', re.M)


def raw_rows(fs: Any, version: str, shard: ShardInfo) -> list[tuple[bytes, bytes, bytes]]:
    """``shard``'s members: path, token and label id as the JSON bytes of the list.

    Compared with :func:`tfshards.listing.storedlisting.plain_rows`:
    both are written by ``json`` with ``ensure_ascii=False``, so equal strings
    are equal bytes. A list with an escaped character is decoded and re-encoded.

    Raises:
        InputError: as :func:`load`.
    """
    data = read(fs, version, shard)
    found: list[tuple[bytes, bytes, bytes]] = _PLAIN_ROW.findall(data)
    if len(found) == shard.records:
        return found
    where = storage.unstrip(fs, layout.records_path(version, shard.name))
    rows = _checked(data, where, shard)
    return [(_json_bytes(p), _json_bytes(t), str(label).encode()) for p, t, label in rows]


def lines(fs: Any, version: str, shard: ShardInfo) -> list[bytes]:
    """``shard``'s member lines as written (:func:`encode`), without their newlines.

    Raises:
        InputError: the list is missing or does not match the manifest's ``records_sha256``.
    """
    data = read(fs, version, shard)
    return data.split(b"\n")[:-1] if data.endswith(b"\n") else data.split(b"\n")


def _json_bytes(text: str) -> bytes:
    return json.dumps(text, ensure_ascii=False)[1:-1].encode()


def load(fs: Any, version: str, shard: ShardInfo, *, trusted: bool = False) -> list[Row]:
    """The rows of ``shard``'s member list in the version directory ``version`` on ``fs``.

    ``trusted``: when the sha256 matches the manifest's, skip the check of each
    row's types (1.5 us a row); the caller then turns a malformed row's
    ``TypeError`` or ``IndexError`` into an error of its own.

    Raises:
        InputError: the list is missing or malformed, holds another number of
            records than its shard, or does not match the manifest's ``records_sha256``.
    """
    data = read(fs, version, shard)
    where = storage.unstrip(fs, layout.records_path(version, shard.name))
    return _checked(data, where, shard, trusted=trusted)


def of_shard(fs: Any, version: str, shard: ShardInfo, compression: str) -> list[Row]:
    """The member list of ``shard``; for a shard written before member lists (the
    manifest records none, and there is no file), the same rows read from its records'
    ``path``, ``sha256`` and ``label`` features (the whole shard is read).

    Raises:
        InputError: what :func:`load` raises; a record of such a shard without those
            features, or that is no Example (one line naming the shard and record).
    """
    if shard.records_sha256 is not None or fs.exists(layout.records_path(version, shard.name)):
        return load(fs, version, shard)
    from tfshards.format import exampleparser, tfrecord

    where = storage.unstrip(fs, storage.join(version, shard.name))
    data = storage.read_bytes(fs, storage.join(version, shard.name))
    stream = tfrecord.decompress(data, compression)
    rows: list[Row] = []
    for record in tfrecord.scan(stream):
        if record.problem is not None:
            raise InputError(f"{where}: record {record.index}: {record.problem}", path=where)
        try:
            features = exampleparser.decode(record.data or b"")
            path = bytes(features["path"][1][0]).decode("utf-8")
            token = "sha256:" + bytes(features["sha256"][1][0]).decode("ascii")
            label = int(features["label"][1][0])
        except (exampleparser.DecodeError, KeyError, IndexError, UnicodeDecodeError) as exc:
            raise InputError(
                f"{where}: record {record.index}: expected the path, sha256 and label a "
                f"member list holds (this shard has no member list), found {exc!r}",
                path=where,
            ) from None
        rows.append(Member(path, token, label))
    return rows


def read(fs: Any, version: str, shard: ShardInfo) -> bytes:
    """The member list's bytes, checked against the manifest's ``records_sha256``."""
    path = layout.records_path(version, shard.name)
    where = storage.unstrip(fs, path)
    try:
        data = storage.read_bytes(fs, path)
    except FileNotFoundError:
        raise InputError(
            f"{where}: member list not found (every shard written since split buckets has "
            "one; a set written before them has none)",
            path=where,
        ) from None
    if shard.records_sha256 is not None:
        found = hashlib.sha256(data).hexdigest()
        if found != shard.records_sha256:
            raise InputError(
                f"{where}: expected sha256 {shard.records_sha256} (the manifest's "
                f"records_sha256), found {found}",
                path=where,
            )
    return data


def _checked(data: bytes, where: str, shard: ShardInfo, *, trusted: bool = False) -> list[Row]:
    """The rows of ``data``, as many as the shard's records."""
    rows = decode(data, where, trusted=trusted and shard.records_sha256 is not None)
    if len(rows) != shard.records:
        raise InputError(
            f"{where}: expected {shard.records} members (the manifest's records), "
            f"found {len(rows)}",
            path=where,
        )
    return rows


def _by_line(data: bytes, source: str) -> Iterator[Member]:
    for number, line in enumerate(data.splitlines(), 1):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: nested ~1,000 deep
            row = None
        if not _is_row(row):
            raise InputError(
                f"{source}: line {number}: expected [path, token, label id], found {line[:80]!r}",
                path=source,
            )
        yield Member(*row)


def _is_row(row: Any) -> bool:
    return (
        type(row) is list
        and len(row) == 3
        and type(row[0]) is str
        and type(row[1]) is str
        and type(row[2]) is int
        and row[2] >= 0
    )
