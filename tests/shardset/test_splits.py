"""The split's sides across versions, per-split records per label, class-balance warnings,
and groups kept on one side."""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import pytest

from tfshards.errors import ConfigError
from tfshards.format import tfrecord
from tfshards.format.exampleparser import decode
from tfshards.listing.listing import list_files
from tfshards.shardset.manifest import Manifest, ShardInfo
from tfshards.shardset.split import (
    BALANCE_TOLERANCE,
    Split,
    SplitWarning,
    balance_warnings,
    label_counts,
    split,
)
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write


def _shard(name: str, records: int) -> ShardInfo:
    return ShardInfo(name, records, 0, "")


def _bucketed(held: list[int]) -> Manifest:
    """A manifest of one shard per non-empty bucket, ``held[b]`` records in bucket ``b``."""
    shards = tuple(
        ShardInfo(f"data-{b:05d}.tfrecord", n, n, f"{b:064x}", bucket=b)
        for b, n in enumerate(held)
        if n
    )
    return Manifest("/nowhere", "f" * 16, {"buckets": len(held)}, (), ("a",), "none", shards)


def _val_buckets(held: list[int], fraction: float, seed: int) -> tuple[set[int], bool]:
    """The validation buckets, and whether the set was too small for them (it borrowed)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SplitWarning)
        part = split(_bucketed(held), fraction, seed)
    borrowed = any("too few" in str(w.message) for w in caught)
    return {s.bucket for s in part.val if s.bucket is not None}, borrowed


def test_a_bucket_keeps_its_side_however_the_others_fill():
    """Growth that fills empty buckets or shifts the buckets' sizes moves no bucket."""
    rng = random.Random(0)
    moved, checked = [], 0
    for trial in range(400):
        count, fraction = rng.choice((8, 16, 32)), rng.choice((0.1, 0.2, 0.3))
        before = [rng.choice((0, 1, 5, 40)) * rng.randint(0, 3) for _ in range(count)]
        before[0] = before[1] = 30  # at least two filled buckets: a split exists
        after = [n + rng.choice((0, 0, 1, 25)) for n in before]  # files added anywhere
        (old, borrowed_old), (new, borrowed_new) = (
            _val_buckets(before, fraction, trial),
            _val_buckets(after, fraction, trial),
        )
        if borrowed_old or borrowed_new:  # too few records for the rule: it says so
            continue
        checked += 1
        both = [b for b in range(count) if before[b] and after[b]]
        if [b in old for b in both] != [b in new for b in both]:
            moved.append((count, fraction, trial, before, after))
    assert moved == [] and checked > 300


def test_the_validation_count_is_the_fraction_of_the_bucket_count():
    held = [50] * 16
    assert len(_val_buckets(held, 0.2, 0)[0]) == 3  # round(3.2)
    assert len(_val_buckets(held, 0.25, 0)[0]) == 4
    held[5] = 5000  # one heavy bucket changes no count
    assert all(len(_val_buckets(held, 0.2, s)[0]) == 3 for s in range(20))


def test_a_set_too_small_for_its_buckets_borrows_and_says_so():
    held = [0] * 16
    held[3], held[9] = 4, 6  # two of 16 buckets hold records
    borrowed = 0
    for seed in range(20):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", SplitWarning)
            part = split(_bucketed(held), 0.2, seed)
        assert part.val_records and part.train_records, (seed, part)
        borrowed += any("too few for the 3 validation buckets" in str(w.message) for w in caught)
    assert borrowed > 10  # most seeds pick 3 empty buckets


def test_one_filled_bucket_cannot_be_split():
    held = [0] * 16
    held[7] = 10
    with pytest.raises(ConfigError, match="at least 2 split buckets"):
        split(_bucketed(held), 0.2, 0)


def test_adding_one_file_to_a_small_set_moves_no_record_across_the_split(make_raw, tmp_path):
    """24 files of 2 labels in 16 buckets, grown one file at a time: sides never move."""
    raw = make_raw(24, 16, classes=2)
    out, manifest_path = tmp_path / "shards", tmp_path / "manifest.json"
    sides: dict[str, str] = {}
    for step in range(4):
        if step:
            src = sorted(raw.rglob("*.jpg"))[step]
            (src.parent / f"extra{step}.jpg").write_bytes(src.read_bytes() + bytes([step, 0]))
        listing = list_files(str(raw))
        config = WriteConfig(out=str(out), manifest_copy=str(manifest_path), executor="serial")
        manifest = write(config, listing, progress=False).manifest
        for seed in range(6):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", SplitWarning)
                part = split(manifest, 0.2, seed)
            for side, shards in (("train", part.train), ("val", part.val)):
                for shard in shards:
                    for path in _paths(manifest, shard):
                        assert sides.setdefault(f"{seed}:{path}", side) == side, (step, path)


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


def test_a_label_only_on_the_validation_side_is_named_missing_from_training():
    """It warned as a share mismatch ("90.9% of validation but 0.0% of training"), even for
    a label of one record, while the model never sees it."""
    counts = {"train": {"a": 200, "b": 0, "c": 40}, "val": {"a": 10, "b": 1, "c": 0}}
    assert balance_warnings(counts)[0] == (
        "label 'b': missing from training (1 validation record): the model never sees it, "
        "so it scores none of them right (its files or groups all fall on the validation side)"
    )


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


def _paths(manifest: Manifest, shard: ShardInfo) -> list[str]:
    data = Path(manifest.shard_url(shard)).read_bytes()
    return [bytes(decode(r.data)["path"][1][0]).decode() for r in tfrecord.scan(data)]


def _groups(manifest: Manifest, shards: tuple[ShardInfo, ...]) -> set[str]:
    """The last digit of each record's file number (its group), over ``shards``."""
    found = set()
    for shard in shards:
        for record in tfrecord.scan(Path(manifest.shard_url(shard)).read_bytes()):
            found.add(bytes(decode(record.data)["path"][1][0]).decode()[-5])
    return found


def test_sampling_noise_around_the_bucket_step_does_not_warn_and_a_coarse_step_does():
    held = [12] * 16
    held[0] = held[1] = 5  # 31 of 200 can come out in validation: 0.155 against 3/16
    with warnings.catch_warnings():
        warnings.simplefilter("error", SplitWarning)
        for seed in range(30):
            split(_bucketed(held), 0.2, seed)
    with pytest.warns(SplitWarning, match="2 buckets split in steps of 1/2"):
        split(_bucketed([100, 100]), 0.1, 0)  # the bucket count cannot come close
