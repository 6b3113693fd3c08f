"""A plan is one frozen value, the same from a listing in memory and the same one stored."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tfshards.listing.listing import list_files, write_listing
from tfshards.listing.storedlisting import open_stored
from tfshards.project.sample import write_synthetic
from tfshards.writing.config import WriteConfig
from tfshards.writing.plan import Plan, plan, read_groups


def _entries(planned: Plan) -> list[list[tuple[str, int, int, str]]]:
    return [[tuple(e) for b in t.rows.batches() for e in b] for t in planned.tasks]


@pytest.mark.parametrize("group_by", [None, r"^(\d+)/"])
def test_stored_and_in_memory_listings_give_the_same_plan(
    tmp_path: Path, group_by: str | None
) -> None:
    write_synthetic(str(tmp_path / "raw"), 30, 16, classes=3, workers=1)
    listing = list_files(str(tmp_path / "raw"))
    write_listing(listing, str(tmp_path / "listing"))
    stored = open_stored(str(tmp_path / "listing"))
    assert stored is not None
    config = WriteConfig(out=str(tmp_path / "out"), num_shards=3, seed=7, group_by=group_by)
    here = plan(listing, config, groups=read_groups(listing, group_by))
    there = plan(stored, config, groups=read_groups(stored, group_by))
    assert (here.version, here.params) == (there.version, there.params)
    assert _entries(here) == _entries(there)
    assert sorted(e for shard in _entries(here) for e in shard) == sorted(listing.entries)
    assert here.fingerprint == here.version.rsplit("/", 1)[-1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        here.version = "elsewhere"  # type: ignore[misc]
