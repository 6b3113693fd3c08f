"""Generate the benchmark's synthetic image trees once and reuse them."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass

from tfshards.listing.listing import Listing, list_files
from tfshards.project.sample import write_synthetic


@dataclass(frozen=True)
class DataSet:
    """A synthetic JPEG tree in class folders: ``count`` images of ``size`` x ``size``."""

    name: str
    count: int
    size: int
    classes: int = 10
    seed: int = 0

    def scaled(self, scale: float, minimum: int = 32) -> DataSet:
        """The same set with ``count * scale`` images (at least ``minimum``: 16 shards + some)."""
        count = max(minimum, round(self.count * scale))
        return DataSet(self.name, count, self.size, self.classes, self.seed)

    @property
    def dirname(self) -> str:
        return f"{self.name}-{self.count}x{self.size}"


# ~4 KB and ~72 KB JPEGs: thumbnail-sized and photo-sized records.
SMALL = DataSet("small", 20_000, 96)
LARGE = DataSet("large", 2_000, 512)
# ~1.3 KB, ~2.5 KB and ~16 KB JPEGs: the read-by-size rows' other sizes (with SMALL and LARGE).
TINY = DataSet("tiny", 5_000, 32)
THUMB = DataSet("thumb", 5_000, 64)
MEDIUM = DataSet("medium", 2_000, 224)


def ensure(data: DataSet, base: str) -> tuple[str, float]:
    """Write ``data`` under ``base`` unless a complete copy is there; returns (root, seconds).

    Completion is marked by ``<root>.json`` (outside the tree, so the listing
    never sees it), written after the last image.
    """
    root = os.path.join(base, data.dirname)
    marker = root + ".json"
    expected = asdict(data)
    if os.path.exists(marker):
        with open(marker) as f:
            if json.load(f) == expected:
                return root, 0.0
    shutil.rmtree(root, ignore_errors=True)
    start = time.perf_counter()
    write_synthetic(
        root, data.count, data.size, classes=data.classes, seed=data.seed, workers=os.cpu_count()
    )
    seconds = time.perf_counter() - start
    with open(marker, "w") as f:
        json.dump(expected, f, sort_keys=True)
    return root, seconds


def listing_of(root: str) -> Listing:
    return list_files(root)


def subset(listing: Listing, every: int) -> Listing:
    """Every ``every``-th entry (all classes keep files), for memory scaling runs."""
    return Listing(listing.root, listing.labels, listing.entries[::every])
