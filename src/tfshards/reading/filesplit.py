"""The train/validation split of raw files, for ``from_files`` readers.

The shard-set split (:func:`tfshards.shardset.split.split`) chooses whole shard
files; a generator over raw files has no shards, so the same choice is made
over the listing's sorted paths, with the same seeded shuffle and rounding
(:func:`tfshards.shardset.split.choose_val`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from tfshards import jsonfile
from tfshards.listing.listing import Listing
from tfshards.shardset.split import choose_val


@dataclass(frozen=True)
class FileSplit:
    """Train and validation files, chosen by :func:`split_files`."""

    train: Listing
    val: Listing
    seed: int
    val_fraction: float
    effective_val_fraction: float

    def to_json(self) -> bytes:
        """Counts and a digest of each side's paths: enough for lineage without a file list."""

        def side(listing: Listing) -> dict[str, Any]:
            digest = hashlib.sha256("\n".join(e.path for e in listing.entries).encode())
            return {"files": len(listing.entries), "paths_sha256": digest.hexdigest()}

        doc = {
            "effective_val_fraction": round(self.effective_val_fraction, 6),
            "root": self.train.root,
            "seed": self.seed,
            "train": side(self.train),
            "val": side(self.val),
            "val_fraction": self.val_fraction,
            "version": 1,
        }
        return jsonfile.encode(doc)


def split_files(listing: Listing, val_fraction: float, seed: int = 0) -> FileSplit:
    """Split a listing's files into train and validation, like :func:`split`.

    The sorted paths are shuffled with ``random.Random(seed)`` and the first
    ``round(val_fraction * files)`` (at least one, at most all but one) go to
    validation. Both sides keep the listing's root and labels.
    """
    entries = listing.entries
    train, val, effective = choose_val(
        [e.path for e in entries],
        [1] * len(entries),
        val_fraction,
        seed,
        unit="file",
        counted="files",
    )

    def sub(indices: list[int]) -> Listing:
        return Listing(listing.root, listing.labels, tuple(entries[i] for i in indices))

    return FileSplit(sub(train), sub(val), seed, val_fraction, effective)
