"""Files of a listing or a version edited by hand, with their digests made to agree: the
edits a careful user (or an attacker) makes, which only the content checks can catch."""

from __future__ import annotations

import hashlib
import itertools
import json
from array import array
from collections.abc import Callable
from pathlib import Path

from tfshards.shardset import layout
from tfshards.shardset.manifest import Manifest, ShardInfo


def edit_listing_line(listing: Path, n: int, old: bytes, new: bytes) -> None:
    """Replace ``old`` by ``new`` on line ``n`` (0-based) of ``listing/files.jsonl``; the
    line offsets (``files.idx``) and meta.json's digest are rewritten to agree."""
    lines = (listing / "files.jsonl").read_bytes().split(b"\n")
    assert old in lines[n]
    lines[n] = lines[n].replace(old, new)
    data = b"\n".join(lines)
    (listing / "files.jsonl").write_bytes(data)
    starts = itertools.accumulate((len(line) + 1 for line in lines[:-1]), initial=0)
    (listing / "files.idx").write_bytes(array("Q", starts).tobytes())
    meta = json.loads((listing / "meta.json").read_text())
    meta["files_sha256"] = hashlib.sha256(data).hexdigest()
    (listing / "meta.json").write_text(json.dumps(meta))


def edit_member_rows(
    version: Manifest, shard: ShardInfo, edit: Callable[[list[bytes]], None], *copies: Path
) -> str:
    """Apply ``edit`` to the rows of ``shard``'s member list in ``version``; its
    ``records_sha256`` is rewritten to agree in the version's manifest and in ``copies``
    (the pipeline's manifest copy). Returns the new digest."""
    members = Path(layout.records_path(version.directory, shard.name))
    rows = members.read_bytes().split(b"\n")
    edit(rows)
    members.write_bytes(b"\n".join(rows))
    digest = hashlib.sha256(members.read_bytes()).hexdigest()
    assert shard.records_sha256 is not None
    for copy in (Path(version.directory) / layout.MANIFEST_NAME, *copies):
        copy.write_text(copy.read_text().replace(shard.records_sha256, digest))
    return digest
