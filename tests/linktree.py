"""Large listings made cheaply: hard links to 10 small files, listed without hashing each."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tfshards.listing.entry import Entry
from tfshards.listing.listing import Listing, write_listing


def link_tree_listing(tmp_path: Path, files: int, file_bytes: int = 16) -> str:
    """``files`` hard links to 10 real ``file_bytes``-byte JPEG stubs (one per label).

    Returns the stored listing's folder. Each label's files share one payload,
    so a set written from it holds 10 distinct payloads, each repeated.
    """
    root = tmp_path / f"raw{files}"
    entries = []
    for label in range(10):
        folder = root / f"l{label}"
        folder.mkdir(parents=True)
        # a JPEG's start, scan and end markers around the label's bytes: a whole JPEG to the writer
        data = b"\xff\xd8\xff\xda" + bytes([label]) * (file_bytes - 6) + b"\xff\xd9"
        (folder / ".stub").write_bytes(data)
        token = "sha256:" + hashlib.sha256(data).hexdigest()
        for i in range(label, files, 10):
            name = f"{i:07d}.jpg"
            os.link(folder / ".stub", folder / name)
            entries.append(Entry(f"l{label}/{name}", len(data), label, token))
    labels = tuple(f"l{label}" for label in range(10))
    out = str(tmp_path / f"listing{files}")
    write_listing(Listing(str(root), labels, tuple(sorted(entries))), out)
    return out
