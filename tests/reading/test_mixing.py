"""A weighted mix of two shard sets: exact shares per epoch, seeded, resumable, no val leakage."""

from __future__ import annotations

import collections
import random
from pathlib import Path

import pytest

from tfshards.errors import ConfigError
from tfshards.listing.listing import list_files
from tfshards.project.sample import write_synthetic
from tfshards.reading import loader, mixing
from tfshards.reading.epochorder import Position
from tfshards.shardset import split as splits
from tfshards.shardset.manifest import Manifest
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

EPOCH = 214  # 150 and 90 records at 0.7/0.3: the largest epoch where neither repeats
COUNTS = [150, 64]
KW = {"features": ["sha256"], "decode": False}


def _set(base: Path, count: int, seed: int, size: int = 8, classes: int = 10) -> Manifest:
    write_synthetic(
        str(base / "img"), count, size, fmt="png", classes=classes, seed=seed, workers=1
    )
    config = WriteConfig(out=str(base / "shards"), num_shards=4, workers=1, executor="serial")
    return write(config, list_files(str(base / "img")), progress=False).manifest


@pytest.fixture(scope="module")
def two_sets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Manifest, Manifest]:
    """150 and 90 synthetic 8 px PNGs (other seeds: no image in both), 4 shards each."""
    return (
        _set(tmp_path_factory.mktemp("a"), 150, seed=0),
        _set(tmp_path_factory.mktemp("b"), 90, seed=1),
    )


def _sources(two_sets: tuple[Manifest, Manifest]) -> list[mixing.Source]:
    a, b = two_sets
    return [mixing.Source(a.shards, a, 0.7), mixing.Source(b.shards, b, 0.3)]


def _shas(ds) -> list[bytes]:  # type: ignore[no-untyped-def]
    return [s for features, _ in ds for s in features["sha256"].numpy().tolist()]


def _all_shas(manifest: Manifest, shards=None) -> list[bytes]:  # type: ignore[no-untyped-def]
    ds = loader.make_dataset(
        shards or manifest.shards, manifest, batch_size=64, training=False, **KW
    )
    return _shas(ds)


def test_mixed_steps_per_epoch_refuses_a_bad_batch_size_or_worker(two_sets):
    sources = _sources(two_sets)
    with pytest.raises(ConfigError, match=r"^batch_size must be an integer >= 1, got -5$"):
        mixing.steps_per_epoch(sources, -5)
    with pytest.raises(ConfigError, match=r"^batch_size must be an integer >= 1, got 0$"):
        mixing.steps_per_epoch(sources, 0)
    with pytest.raises(ConfigError, match=r"^worker must be \(index, count\), 0 <= index"):
        mixing.steps_per_epoch(sources, 10, worker=(2, 2))


def test_each_mixed_epoch_takes_exact_counts_from_each_source(two_sets):
    sources = _sources(two_sets)
    owner = {s: 0 for s in _all_shas(two_sets[0])} | {s: 1 for s in _all_shas(two_sets[1])}
    assert len(owner) == 240  # the sets share no image
    ds = mixing.mix_datasets(sources, batch_size=107, seed=3, **KW)
    stream = _shas(ds.take(6))
    assert mixing.steps_per_epoch(sources, 107) == 2 == EPOCH // 107
    seen_b = []
    for e in range(3):
        epoch = stream[e * EPOCH : (e + 1) * EPOCH]
        counts = collections.Counter(owner[s] for s in epoch)
        assert [counts[0], counts[1]] == COUNTS
        assert abs(counts[0] / EPOCH - 0.7) < 0.005 and abs(counts[1] / EPOCH - 0.3) < 0.005
        assert len(set(s for s in epoch if owner[s] == 0)) == 150  # all of A, once
        seen_b += [s for s in epoch if owner[s] == 1]
    # B's own epochs run on across mixed epochs: 192 records are 2 whole epochs and 12.
    assert len(set(seen_b[:90])) == len(set(seen_b[90:180])) == 90


def test_explicit_epoch_size_rounds_the_shares_by_largest_remainder(two_sets):
    sources = _sources(two_sets)
    owner = {s: 1 for s in _all_shas(two_sets[1])}
    ds = mixing.mix_datasets(sources, batch_size=7, seed=0, epoch_size=101, repeat=False, **KW)
    assert len(ds) == 15  # 101 records in batches of 7, the last partial
    stream = _shas(ds)
    assert len(stream) == 101 and sum(owner.get(s, 0) for s in stream) == 30  # 30.3 -> 30


def test_the_order_is_fixed_by_the_seed(two_sets):
    sources = _sources(two_sets)
    first = _shas(mixing.mix_datasets(sources, batch_size=8, seed=4, **KW).take(40))
    again = _shas(mixing.mix_datasets(sources, batch_size=8, seed=4, **KW).take(40))
    other = _shas(mixing.mix_datasets(sources, batch_size=8, seed=5, **KW).take(40))
    assert first == again and first != other


def test_a_mix_resumed_in_its_second_epoch_is_the_rest_of_the_uninterrupted_one(two_sets):
    sources = _sources(two_sets)
    whole = _shas(mixing.mix_datasets(sources, batch_size=20, seed=9, **KW).take(3 * EPOCH // 20))
    rng = random.Random(11)
    for record in [0, EPOCH - 1, *rng.sample(range(1, EPOCH - 1), 2)]:
        at = EPOCH + record
        rest = mixing.mix_datasets(sources, batch_size=20, seed=9, start=(1, record), **KW)
        got = _shas(rest.take((len(whole) - at) // 20))
        assert got == whole[at : at + len(got)] and len(got) >= len(whole) - at - 19
        one = mixing.mix_datasets(
            sources, batch_size=20, seed=9, start=Position(1, record), repeat=False, **KW
        )
        assert _shas(one) == whole[at : 2 * EPOCH]


def test_the_val_side_of_each_source_never_reaches_the_mix(two_sets):
    a, b = two_sets
    sa, sb = splits.split(a, 0.25, seed=0), splits.split(b, 0.25, seed=0)
    train = [mixing.Source(sa.train, a, 0.7), mixing.Source(sb.train, b, 0.3)]
    val = [mixing.Source(sa.val, a), mixing.Source(sb.val, b)]
    mixed = set(_shas(mixing.mix_datasets(train, batch_size=8, seed=0, **KW).take(100)))
    held = _shas(mixing.validation_dataset(val, batch_size=8, **KW))
    assert held == _all_shas(a, sa.val) + _all_shas(b, sb.val)  # file order, A then B
    assert len(mixed) == sa.train_records + sb.train_records  # 800 reads cover both train sides
    assert not mixed & set(held)
    assert len(mixing.validation_dataset(val, batch_size=8, **KW)) == -(-len(held) // 8)


def test_sources_decode_to_one_shape_with_one_image_size(two_sets, tmp_path):
    a, _ = two_sets
    big = _set(tmp_path, 20, seed=2, size=12)
    sources = [mixing.Source(a.shards, a, 0.5), mixing.Source(big.shards, big, 0.5)]
    with pytest.raises(ConfigError, match="pass one image_size"):
        mixing.mix_datasets(sources, batch_size=4)
    images, labels = next(iter(mixing.mix_datasets(sources, batch_size=4, image_size=(10, 10))))
    assert images.shape == (4, 10, 10, 3) and labels.shape == (4,)


def test_a_grey_set_mixes_into_rgb_ones_at_the_first_sets_channels(two_sets, tmp_path):
    """With one image_size, the mix takes the first set's channels for every set (the train
    stage has no channels option, and said to pass one)."""
    from PIL import Image

    a, _ = two_sets
    write_synthetic(str(tmp_path / "img"), 20, 8, fmt="png", classes=10, seed=2, workers=1)
    for path in (tmp_path / "img").rglob("*.png"):
        Image.open(path).convert("L").save(path)
    config = WriteConfig(out=str(tmp_path / "shards"), num_shards=4, workers=1, executor="serial")
    grey = write(config, list_files(str(tmp_path / "img")), progress=False).manifest
    rgb_first = [mixing.Source(a.shards, a, 0.5), mixing.Source(grey.shards, grey, 0.5)]
    images, _ = next(iter(mixing.mix_datasets(rgb_first, batch_size=4, image_size=(8, 8))))
    assert images.shape == (4, 8, 8, 3)
    grey_first = rgb_first[::-1]
    images, _ = next(iter(mixing.mix_datasets(grey_first, batch_size=4, image_size=(8, 8))))
    assert images.shape == (4, 8, 8, 1)
    for sources, channels in ((rgb_first, 3), (grey_first, 1)):  # the validation side too
        val = mixing.validation_dataset(sources, batch_size=4, image_size=(8, 8))
        assert val.element_spec[0].shape.as_list() == [None, 8, 8, channels]
        assert sum(int(x.shape[0]) for x, _ in val) == a.records + grey.records


def test_sources_must_name_the_same_labels(two_sets, tmp_path):
    a, _ = two_sets
    three = _set(tmp_path, 12, seed=2, classes=3)
    sources = [mixing.Source(a.shards, a), mixing.Source(three.shards, three)]
    with pytest.raises(ConfigError, match=r"source 1 .* lacks \['03'"):
        mixing.mix_datasets(sources, batch_size=4, **KW)
    with pytest.raises(ConfigError, match="sets training"):
        mixing.mix_datasets(_sources(two_sets), batch_size=4, training=False, **KW)


def test_a_shard_in_two_sources_is_refused_and_halves_of_one_set_mix(two_sets):
    a, _ = two_sets
    twice = [mixing.Source(a.shards, a, 0.5), mixing.Source(a.shards[1:], a, 0.5)]
    with pytest.raises(ConfigError) as info:
        mixing.mix_datasets(twice, batch_size=4, **KW)
    assert str(info.value) == (
        f"sources 0 and 1 hold shard {a.shards[1].name} of version {a.fingerprint} twice: "
        "its records would come twice per mixed epoch; give each shard to one source, once "
        "(a weight sets how often)"
    )
    within = [mixing.Source((*a.shards, a.shards[0]), a, 1.0)]
    with pytest.raises(ConfigError, match=rf"^source 0 lists shard {a.shards[0].name} of"):
        mixing.mix_datasets(within, batch_size=4, **KW)
    halves = [mixing.Source(a.shards[:2], a, 0.5), mixing.Source(a.shards[2:], a, 0.5)]
    assert mixing.validation_dataset(halves, batch_size=4, **KW).cardinality() > 0


def test_workers_mix_disjoint_blocks_of_each_source(two_sets):
    sources = _sources(two_sets)
    assert mixing.plan_of(sources, worker=(0, 2)).counts.tolist() == [75, 32]  # of 75 and 45
    parts = []
    for index in range(2):
        ds = mixing.mix_datasets(sources, batch_size=10, worker=(index, 2), repeat=False, **KW)
        assert len(ds) == 11 and mixing.steps_per_epoch(sources, 10, worker=(index, 2)) == 10
        parts.append(_shas(ds))
    assert len(parts[0]) == len(parts[1]) == 107
    assert len(set(parts[0]) | set(parts[1])) == 214  # no record on both workers
