"""Per-split records per label, class-balance warnings, and groups kept on one side."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfshards.format import tfrecord
from tfshards.format.exampleparser import decode
from tfshards.shardset.manifest import Manifest, ShardInfo
from tfshards.shardset.split import BALANCE_TOLERANCE, Split, balance_warnings, label_counts, split


def _shard(name: str, records: int) -> ShardInfo:
    return ShardInfo(name, records, 0, "")


def test_label_counts_add_each_sides_shards():
    a, b, c = _shard("a", 5), _shard("b", 4), _shard("c", 3)
    split = Split(train=(a, b), val=(c,), seed=0, val_fraction=0.25, effective_val_fraction=0.25)
    per_shard = {"a": (3, 2), "b": (1, 3), "c": (2, 1)}
    assert label_counts(split, per_shard, ("cat", "dog")) == {
        "train": {"cat": 4, "dog": 5},
        "val": {"cat": 2, "dog": 1},
    }


def test_a_label_missing_from_validation_is_named():
    counts = {"train": {"cat": 50, "dog": 50}, "val": {"cat": 10, "dog": 0}}
    assert balance_warnings(counts) == [
        "label 'cat': 100.0% of validation records but 50.0% of training records "
        "(more than 49.5% apart: 5% and 3 standard errors)",
        "label 'dog': missing from validation (50 training records)",
    ]


def test_shares_further_apart_than_the_tolerance_warn_and_closer_ones_do_not():
    train = {"cat": 5000, "dog": 5000}
    off = 0.5 + BALANCE_TOLERANCE + 0.01  # cat's share of validation
    near = 0.5 + BALANCE_TOLERANCE - 0.01
    far = {"cat": round(off * 5000), "dog": 5000 - round(off * 5000)}
    close = {"cat": round(near * 5000), "dog": 5000 - round(near * 5000)}
    assert balance_warnings({"train": train, "val": close}) == []
    assert balance_warnings({"train": train, "val": far}) == [
        "label 'cat': 56.0% of validation records but 50.0% of training records "
        "(more than 5.0% apart: 5% and 3 standard errors)",
        "label 'dog': 44.0% of validation records but 50.0% of training records "
        "(more than 5.0% apart: 5% and 3 standard errors)",
    ]


def test_sampling_noise_of_a_small_set_does_not_warn():
    # 300 images of 3 labels, 60 held out: shares 10 points apart happen by chance alone.
    train = {"circle": 80, "square": 80, "triangle": 80}
    assert (
        balance_warnings({"train": train, "val": {"circle": 20, "square": 14, "triangle": 26}})
        == []
    )
    # A rare label expected twice in validation may well be missing from it.
    rare = {"train": {"a": 150, "b": 140, "c": 10}, "val": {"a": 32, "b": 28, "c": 0}}
    assert balance_warnings(rare) == []
    # A label twice as frequent in validation is past the noise even so.
    skewed = {"circle": 40, "square": 10, "triangle": 10}
    assert [w.split(":")[0] for w in balance_warnings({"train": train, "val": skewed})] == [
        "label 'circle'"
    ]


def test_no_validation_side_gives_no_warning():
    assert balance_warnings({"train": {"cat": 3}, "val": {"cat": 0}}) == []


@pytest.mark.filterwarnings(
    "ignore::tfshards.shardset.split.SplitWarning"
)  # whole groups: sizes vary
def test_a_shard_split_of_a_group_by_set_keeps_each_group_on_one_side(
    make_raw, write_set, tmp_path
):
    manifest = write_set(
        make_raw(120, 16, classes=4),
        tmp_path / "shards",
        num_shards=6,
        group_by=r"(\d)\.jpg$",
        executor="serial",
    )
    for seed in range(3):
        part = split(manifest, 0.3, seed)
        sides = [_groups(manifest, part.train), _groups(manifest, part.val)]
        assert sides[0] and sides[1] and sides[0].isdisjoint(sides[1]), sides
        assert sides[0] | sides[1] == set("0123456789")


def _groups(manifest: Manifest, shards: tuple[ShardInfo, ...]) -> set[str]:
    """The last digit of each record's file number (its group), over ``shards``."""
    found = set()
    for shard in shards:
        for record in tfrecord.scan(Path(manifest.shard_url(shard)).read_bytes()):
            found.add(bytes(decode(record.data)["path"][1][0]).decode()[-5])
    return found
