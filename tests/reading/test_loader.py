"""The loader splits shards by file, deterministically, and reads every record once per epoch."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tfshards.errors import ConfigError, RecordError, ShardError
from tfshards.format import tfrecord
from tfshards.format.example import encode_bytes
from tfshards.format.schema import FeatureSpec
from tfshards.listing.listing import list_files
from tfshards.project.sample import write_synthetic
from tfshards.reading import corruption, gate, loader
from tfshards.reading.epochorder import Position
from tfshards.shardset import split as splits
from tfshards.shardset.manifest import Manifest, ShardInfo
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

IMAGES = 200
SIZE = 32
SHARDS = 8


def _fake_manifest(records: list[int]) -> Manifest:
    shards = tuple(
        ShardInfo(f"data-{i:05d}-of-{len(records):05d}.tfrecord", n, 100 * n, f"{i:064x}")
        for i, n in enumerate(records)
    )
    schema = (FeatureSpec("image", "bytes", ()), FeatureSpec("label", "int64", ()))
    return Manifest("/nowhere", "f" * 16, {}, schema, ("a", "b"), "none", shards)


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory: pytest.TempPathFactory) -> tuple[Manifest, dict[bytes, int]]:
    """200 synthetic 32 px JPEGs in 8 shards, and the sha256 -> label of every image."""
    base = tmp_path_factory.mktemp("shards")
    write_synthetic(str(base / "img"), IMAGES, SIZE, workers=1)
    listing = list_files(str(base / "img"))
    config = WriteConfig(out=str(base / "shards"), num_shards=SHARDS, workers=1, executor="serial")
    manifest = write(config, listing, progress=False).manifest
    truth = {}
    for entry in listing.entries:
        data = (base / "img" / entry.path).read_bytes()
        truth[hashlib.sha256(data).hexdigest().encode()] = entry.label
    return manifest, truth


def _collect(ds) -> collections.Counter[bytes]:  # type: ignore[no-untyped-def]
    seen: collections.Counter[bytes] = collections.Counter()
    for features, _ in ds:
        seen.update(features["sha256"].numpy().tolist())
    return seen


# ----------------------------------------------------------------------------- split


def test_split_is_a_pure_function_of_manifest_fraction_and_seed():
    manifest = _fake_manifest([25] * 16)
    a = splits.split(manifest, 0.25, seed=7)
    b = splits.split(manifest, 0.25, seed=7)
    assert a == b and a.to_json() == b.to_json()
    others = {tuple(s.name for s in splits.split(manifest, 0.25, seed=s).val) for s in range(8)}
    assert len(others) > 1  # the seed matters


def test_split_is_stable_across_machines():
    # random.Random(seed).shuffle on the sorted names is the same on every CPython;
    # if this changes, every recorded split in every lineage file changes with it.
    split = splits.split(_fake_manifest([25] * 8), 0.25, seed=0)
    assert [s.name[:10] for s in split.val] == ["data-00001", "data-00004"]


def test_split_is_disjoint_and_covers_every_shard():
    manifest = _fake_manifest([10, 11, 12, 13, 14, 15, 16, 17, 18])
    with pytest.warns(splits.SplitWarning):
        split = splits.split(manifest, 0.3, seed=3)
    train, val = {s.name for s in split.train}, {s.name for s in split.val}
    assert not train & val
    assert train | val == {s.name for s in manifest.shards}
    assert split.train_records + split.val_records == manifest.records
    assert [s.name for s in split.train] == sorted(train)


def test_tiny_fraction_still_gets_one_val_shard_and_warns_with_the_effective_fraction():
    manifest = _fake_manifest([25] * 8)
    with pytest.warns(splits.SplitWarning, match=r"effective fraction of 0\.1250"):
        split = splits.split(manifest, 0.01, seed=0)
    assert len(split.val) == 1 and len(split.train) == 7
    assert split.effective_val_fraction == pytest.approx(0.125)
    assert split.val_fraction == 0.01


def test_large_fraction_keeps_one_train_shard():
    with pytest.warns(splits.SplitWarning):
        split = splits.split(_fake_manifest([25] * 3), 0.99, seed=0)
    assert len(split.train) == 1 and len(split.val) == 2


def test_fraction_the_shards_can_meet_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        split = splits.split(_fake_manifest([25] * 16), 0.25, seed=1)
    assert split.effective_val_fraction == 0.25 and split.val_records == 100


def test_effective_fraction_counts_records_not_shards():
    with pytest.warns(splits.SplitWarning):
        split = splits.split(_fake_manifest([100, 1, 1, 1]), 0.5, seed=0)
    assert split.effective_val_fraction == pytest.approx(split.val_records / 103)


def test_one_shard_cannot_be_split():
    with pytest.raises(ConfigError, match="at least 2 shards"):
        splits.split(_fake_manifest([25]), 0.1, seed=0)


def test_zero_fraction_puts_everything_in_train():
    split = splits.split(_fake_manifest([5]), 0.0, seed=0)
    assert split.val == () and split.train_records == 5


@pytest.mark.parametrize("fraction", [-0.1, 1.0, 1.5, float("nan")])
def test_fraction_out_of_range_is_rejected(fraction):
    with pytest.raises(ConfigError, match="val_fraction"):
        splits.split(_fake_manifest([5, 5]), fraction, seed=0)


def test_split_json_records_where_each_shard_went():
    manifest = _fake_manifest([25] * 4)
    split = splits.split(manifest, 0.25, seed=2)
    doc = json.loads(split.to_json())
    assert doc["val"]["shards"] == [s.name for s in split.val]
    assert doc["train"]["records"] == 75 and doc["val"]["records"] == 25
    assert doc["seed"] == 2 and doc["fingerprint"] == manifest.fingerprint


# ----------------------------------------------------------------------------- dataset


def test_eval_epoch_reads_every_record_exactly_once(shard_set):
    manifest, truth = shard_set
    ds = loader.make_dataset(
        manifest.shards, manifest, batch_size=16, training=False, features=["image", "sha256"]
    )
    assert _collect(ds) == collections.Counter(dict.fromkeys(truth, 1))


def test_training_epoch_without_repeat_reads_every_record_exactly_once(shard_set):
    manifest, truth = shard_set
    ds = loader.make_dataset(
        manifest.shards,
        manifest,
        batch_size=16,
        training=True,
        repeat=False,
        features=["sha256"],
        decode=False,
    )
    assert _collect(ds) == collections.Counter(dict.fromkeys(truth, 1))


@pytest.mark.parametrize(
    ("shards", "keywords", "expected"),
    [
        (slice(None), {"training": False}, 13),  # 200 records in batches of 16: 12 and 8 left
        (slice(None), {"training": False, "drop_remainder": True}, 12),
        (slice(0, 3), {"training": True, "repeat": False}, None),  # the three shards' records
    ],
)
def test_one_pass_knows_its_length_from_the_manifest(shard_set, shards, keywords, expected):
    manifest, _ = shard_set
    chosen = manifest.shards[shards]
    ds = loader.make_dataset(chosen, manifest, batch_size=16, decode=False, **keywords)
    if expected is None:
        expected = -(-sum(s.records for s in chosen) // 16)  # one pass keeps a partial batch
    assert int(ds.cardinality()) == expected == sum(1 for _ in ds)


def test_a_repeating_stream_is_infinite(shard_set):
    manifest, _ = shard_set
    ds = loader.make_dataset(manifest.shards, manifest, batch_size=16, training=True, decode=False)
    assert int(ds.cardinality()) == -1  # tf.data.INFINITE_CARDINALITY


def test_labels_travel_with_their_images(shard_set):
    manifest, truth = shard_set
    ds = loader.make_dataset(
        manifest.shards, manifest, batch_size=32, training=False, features=["sha256"]
    )
    for features, labels in ds:
        for sha, label in zip(features["sha256"].numpy(), labels.numpy(), strict=True):
            assert truth[sha] == label


def test_default_elements_are_float_images_in_unit_range_with_int64_labels(shard_set):
    import tensorflow as tf

    manifest, _ = shard_set
    ds = loader.make_dataset(manifest.shards, manifest, batch_size=16, training=False)
    image_spec, label_spec = ds.element_spec
    assert image_spec == tf.TensorSpec((None, SIZE, SIZE, 3), tf.float32)
    assert label_spec == tf.TensorSpec((None,), tf.int64)
    images, _ = next(iter(ds))
    assert float(tf.reduce_min(images)) >= 0.0 and float(tf.reduce_max(images)) <= 1.0
    assert float(tf.reduce_max(images)) > 0.5  # scaled, not all black


def test_training_stream_has_a_fully_static_element_spec(shard_set):
    manifest, _ = shard_set
    ds = loader.make_dataset(
        manifest.shards, manifest, batch_size=16, training=True, image_size=(24, 20), channels=1
    )
    image_spec, label_spec = ds.element_spec
    assert image_spec.shape.as_list() == [16, 24, 20, 1]
    assert label_spec.shape.as_list() == [16]
    images, _ = next(iter(ds))
    assert images.shape == (16, 24, 20, 1)


def test_uint8_images_are_the_decoded_pixels_unscaled(shard_set):
    import tensorflow as tf

    manifest, _ = shard_set
    kwargs = {"batch_size": 8, "training": False}
    as_uint8 = loader.make_dataset(manifest.shards, manifest, image_dtype="uint8", **kwargs)
    as_float = loader.make_dataset(manifest.shards, manifest, **kwargs)
    assert as_uint8.element_spec[0].dtype == tf.uint8
    (raw, _), (scaled, _) = next(iter(as_uint8)), next(iter(as_float))
    assert tf.reduce_all(tf.abs(tf.cast(raw, tf.float32) / 255.0 - scaled) < 1e-6)


def test_training_repeats_until_told_to_stop(shard_set):
    manifest, _ = shard_set
    ds = loader.make_dataset(manifest.shards, manifest, batch_size=64, training=True)
    assert sum(1 for _ in ds.take(10)) == 10  # 640 records from 200: it went round


def test_same_seed_gives_the_same_order_when_deterministic(shard_set):
    manifest, _ = shard_set

    def order(seed: int) -> list[bytes]:
        ds = loader.make_dataset(
            manifest.shards,
            manifest,
            batch_size=16,
            training=True,
            seed=seed,
            deterministic=True,
            features=["path"],
            decode=False,
        )
        return [p for features, _ in ds.take(20) for p in features["path"].numpy().tolist()]

    first = order(5)
    assert first == order(5)
    assert first != order(6)
    assert len(set(first[:200])) == 200  # the first 200 are one full epoch


def test_undecoded_images_are_the_stored_bytes(shard_set):
    manifest, truth = shard_set
    ds = loader.make_dataset(manifest.shards, manifest, batch_size=8, training=False, decode=False)
    encoded, _ = next(iter(ds))
    for data in encoded.numpy():
        assert hashlib.sha256(data).hexdigest().encode() in truth


def test_unknown_feature_is_a_config_error(shard_set):
    manifest, _ = shard_set
    with pytest.raises(ConfigError, match="not in the shards' schema"):
        loader.make_dataset(
            manifest.shards, manifest, batch_size=8, training=False, features=["nope"]
        )


def test_shard_of_another_manifest_is_rejected(shard_set):
    manifest, _ = shard_set
    stranger = ShardInfo("data-00000-of-00008.tfrecord", 1, 2, "0" * 64)
    with pytest.raises(ConfigError, match="not a shard of this manifest"):
        loader.make_dataset([stranger], manifest, batch_size=8, training=False)


def test_a_stream_does_not_depend_on_the_order_the_shards_are_listed_in(shard_set):
    """Two workers given one split in two orders read overlapping records before."""
    manifest, _ = shard_set

    def paths(shards, worker):  # type: ignore[no-untyped-def]
        ds = loader.make_dataset(
            shards, manifest, batch_size=10, training=True, repeat=False, worker=worker,
            features=["path"], decode=False,
        )  # fmt: skip
        return [p for features, _ in ds for p in features["path"].numpy().tolist()]

    listed = list(manifest.shards)
    assert paths(listed[::-1], (0, 1)) == paths(listed, (0, 1))
    first, second = paths(listed, (0, 2)), paths(listed[::-1], (1, 2))
    assert not set(first) & set(second) and len(set(first) | set(second)) == IMAGES


@pytest.mark.parametrize("training", [True, False])
def test_a_shard_listed_twice_or_no_shard_is_one_line(shard_set, training):
    manifest, _ = shard_set
    twice = [*manifest.shards, manifest.shards[3]]
    with pytest.raises(ConfigError, match=r"^data-00003-of-00008.tfrecord: listed twice in"):
        loader.make_dataset(twice, manifest, batch_size=8, training=training)
    with pytest.raises(ConfigError, match=r"^no shards to read \(an empty split\?\)$"):
        loader.make_dataset([], manifest, batch_size=8, training=training)
    with pytest.raises(ConfigError, match=r"^data-00003-of-00008.tfrecord: listed twice in"):
        loader.steps_per_epoch(twice, 8)


@pytest.mark.parametrize(
    ("batch_size", "worker", "message"),
    [
        (-5, (0, 1), r"^batch_size must be an integer >= 1, got -5$"),
        (0, (0, 1), r"^batch_size must be an integer >= 1, got 0$"),
        (32, (3, 2), r"^worker must be \(index, count\), 0 <= index < count, got \(3, 2\)$"),
        (32, (0, 0), r"^worker must be \(index, count\), 0 <= index < count, got \(0, 0\)$"),
    ],
)
def test_steps_per_epoch_refuses_what_make_dataset_refuses(batch_size, worker, message):
    """Not -174 steps, nor a ZeroDivisionError, nor worker 3 of 2 counted as one of them."""
    manifest = _fake_manifest([100, 100])
    with pytest.raises(ConfigError, match=message):
        loader.steps_per_epoch(manifest.shards, batch_size, worker=worker)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            "make_dataset(m.shards, m, batch_size=8, training='no')",
            r"^training must be True or False, got 'no'$",
        ),
        (
            "make_dataset(m.shards, m, batch_size=8, training=None)",
            r"^training must be True or False, got None$",
        ),
        (
            "make_dataset(m.shards, m, batch_size=8, training=True, input_context=5)",
            r"^input_context must be a tf.distribute.InputContext, got int 5$",
        ),
        (
            "make_dataset(m.shards, m.root, batch_size=8, training=False)",
            r"^expected a Manifest \(tfshards.load_manifest\(path\) reads one\), got str ",
        ),
        (
            "make_dataset([s.name for s in m.shards], m, batch_size=8, training=False)",
            r"^shards must be ShardInfo values \(split\(manifest\).train, manifest.shards\), "
            r"got str 'data-00000-of-00008.tfrecord'$",
        ),
        (
            "make_dataset(m.shards[0], m, batch_size=8, training=False)",
            r"^shards must be a sequence of ShardInfo, got ShardInfo$",
        ),
        (
            "splits.split(m.root, 0.1)",
            r"^expected a Manifest \(tfshards.load_manifest\(path\) reads one\), got str ",
        ),
        ("splits.split(m, '0.1')", r"^val_fraction must be a number in \[0, 1\), got '0.1'$"),
        ("load(5)", r"^expected a path or URL, got int 5$"),
        ("list_files(5)", r"^expected a path or URL, got int 5$"),
        (
            "write(WriteConfig(out=str(tmp)), 5)",
            r"^listing must be a Listing \(tfshards.list_files\(root\)\) or a stored ",
        ),
    ],
)
def test_a_wrong_type_is_one_line_naming_the_argument(shard_set, tmp_path, call, message):
    """Not an AttributeError from inside, nor TensorFlow's tensor conversion error."""
    from tfshards.shardset.manifest import load

    manifest, _ = shard_set
    scope = {
        "m": manifest, "tmp": tmp_path, "make_dataset": loader.make_dataset, "splits": splits,
        "load": load, "list_files": list_files, "write": write, "WriteConfig": WriteConfig,
    }  # fmt: skip
    with pytest.raises(ConfigError, match=message):
        eval(call, scope)


# ----------------------------------------------------------------------------- damage


def _copy_shards(manifest: Manifest, dest: Path) -> Manifest:
    dest.mkdir()
    for shard in manifest.shards:
        (dest / shard.name).write_bytes(Path(manifest.shard_url(shard)).read_bytes())
    return Manifest(
        str(dest),
        manifest.fingerprint,
        manifest.params,
        manifest.schema,
        manifest.labels,
        manifest.compression,
        manifest.shards,
        listed=manifest.listed,
    )


def test_truncated_local_shard_is_refused_before_reading(shard_set, tmp_path):
    manifest = _copy_shards(shard_set[0], tmp_path / "copy")
    shard = manifest.shards[3]
    path = Path(manifest.shard_url(shard))
    path.write_bytes(path.read_bytes()[: shard.bytes // 2])
    with pytest.raises(
        ShardError,
        match=rf"{shard.name}: size mismatch: expected {shard.bytes} bytes, "
        rf"found {shard.bytes // 2}$",
    ):
        loader.make_dataset(manifest.shards, manifest, batch_size=8, training=False)


def _flip_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside some record's payload: its data CRC breaks
    path.write_bytes(bytes(data))


def test_damaged_local_shard_is_named_with_its_record_before_tensorflow_reads(shard_set, tmp_path):
    manifest = _copy_shards(shard_set[0], tmp_path / "copy")
    shard = manifest.shards[5]
    _flip_middle(Path(manifest.shard_url(shard)))
    with pytest.raises(
        RecordError, match=rf"{shard.name}: record \d+ at byte \d+: data CRC"
    ) as info:
        loader.make_dataset(manifest.shards, manifest, batch_size=16, training=False)
    assert info.value.shard == shard.name and isinstance(info.value.offset, int)
    assert "sha256 mismatch" in str(info.value.__cause__)


def test_shard_damaged_after_make_dataset_raises_record_error_naming_the_shard(shard_set, tmp_path):
    manifest = _copy_shards(shard_set[0], tmp_path / "copy")
    shard = manifest.shards[5]
    ds = loader.make_dataset(manifest.shards, manifest, batch_size=16, training=False)
    _flip_middle(Path(manifest.shard_url(shard)))  # verified once; checked again at open
    pattern = rf"{shard.name}: record \d+ at byte \d+"
    with pytest.raises(RecordError, match=pattern) as info, corruption.shard_errors(manifest):
        for _ in ds:
            pass
    assert info.value.shard == shard.name
    assert "CRC" in str(info.value) and isinstance(info.value.offset, int)
    assert corruption.find_corrupt_record(manifest, manifest.shards[:5]) is None


def test_clean_shards_have_no_corrupt_record(shard_set):
    assert corruption.find_corrupt_record(shard_set[0]) is None


def test_errors_that_are_not_about_records_pass_through(shard_set):
    import tensorflow as tf

    with (
        pytest.raises(tf.errors.InvalidArgumentError, match="model"),
        corruption.shard_errors(shard_set[0]),
    ):
        raise tf.errors.InvalidArgumentError(None, None, "model input has the wrong rank")


# ----------------------------------------------------------------------------- hostile shards


def _forge(manifest: Manifest, index: int, data: bytes, records: int | None = None) -> Manifest:
    """Write ``data`` as shard ``index`` and a manifest whose entry matches it (size, sha256)."""
    old = manifest.shards[index]
    Path(manifest.shard_url(old)).write_bytes(data)
    new = ShardInfo(
        old.name,
        old.records if records is None else records,
        len(data),
        hashlib.sha256(data).hexdigest(),
    )
    shards = tuple(new if s.name == old.name else s for s in manifest.shards)
    return dataclasses.replace(manifest, shards=shards)


_HOSTILE_CHILD = """
import json, sys
from tfshards.reading import corruption, loader
from tfshards.errors import TfshardsError
from tfshards.shardset.manifest import load
manifest = load(sys.argv[1])
out = []
for forged in (False, True):
    if forged:
        manifest = load(sys.argv[2])
    try:
        with corruption.shard_errors(manifest):
            for _ in loader.make_dataset(manifest.shards, manifest, batch_size=8, training=False):
                pass
        out.append("read to the end")
    except TfshardsError as exc:
        out.append(f"{type(exc).__name__}: {exc}")
print(json.dumps(out))
"""


@pytest.mark.slow
def test_same_size_shard_declaring_a_64_gib_record_is_refused_not_crashing(shard_set, tmp_path):
    manifest = _copy_shards(shard_set[0], tmp_path / "copy")
    shard = manifest.shards[2]
    path = Path(manifest.shard_url(shard))
    clean = path.read_bytes()
    hostile = (tfrecord.header(1 << 36) + clean[12:])[: len(clean)]  # valid length CRC
    assert len(hostile) == shard.bytes
    path.write_bytes(hostile)
    (tmp_path / "manifest.json").write_bytes(manifest.to_json())
    forged = _forge(manifest, 2, hostile)  # a manifest that vouches for the hostile bytes
    (tmp_path / "forged.json").write_bytes(forged.to_json())
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _HOSTILE_CHILD,
            str(tmp_path / "manifest.json"),
            str(tmp_path / "forged.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]  # SIGSEGV is -11
    plain, vouched = json.loads(result.stdout)
    # Refused before TensorFlow opens it; with the manifest untouched the sha256 fails first,
    # and the scan that follows names the record (the error's cause is the sha256 mismatch).
    assert (
        plain
        == vouched
        == (
            f"RecordError: {manifest.shard_url(shard)}: record 0 at byte 0: truncated record: "
            f"length field says {1 << 36} bytes + 4 CRC bytes, file has {len(clean) - 12} left"
        )
    )


def test_shard_cut_at_a_record_boundary_does_not_read_short(shard_set, tmp_path):
    manifest = _copy_shards(shard_set[0], tmp_path / "copy")
    shard = manifest.shards[4]
    clean = Path(manifest.shard_url(shard)).read_bytes()
    cut = list(tfrecord.scan(clean))[-3].offset  # the last three records gone, framing intact
    forged = _forge(manifest, 4, clean[:cut])  # size and sha256 vouch for it; the count does not
    with pytest.raises(
        ShardError,
        match=rf"{shard.name}: record count mismatch: expected {shard.records}, "
        rf"found {shard.records - 3}$",
    ):
        loader.make_dataset(forged.shards, forged, batch_size=8, training=False)


def test_a_shard_is_verified_once_per_process_and_again_when_it_changes(
    shard_set, tmp_path, monkeypatch
):
    manifest = _copy_shards(shard_set[0], tmp_path / "copy")
    reads: list[str] = []
    real = gate._read

    def counting(path: str, compression: str, check_sha: bool):  # type: ignore[no-untyped-def]
        reads.append(path)
        return real(path, compression, check_sha)

    monkeypatch.setattr(gate, "_read", counting)
    for _ in range(2):  # two datasets, two epochs each
        ds = loader.make_dataset(
            manifest.shards, manifest, batch_size=64, training=False, repeat=False
        )
        for _ in range(2):
            assert sum(int(labels.shape[0]) for _, labels in ds) == IMAGES
    assert sorted(reads) == sorted(manifest.shard_url(s) for s in manifest.shards)
    touched = manifest.shard_url(manifest.shards[1])
    os.utime(touched, ns=(1, 1))  # same bytes, another mtime: read again, once
    reads.clear()
    ds = loader.make_dataset(manifest.shards, manifest, batch_size=64, training=False)
    assert sum(int(labels.shape[0]) for _, labels in ds) == IMAGES
    assert reads == [touched]


def _replace_record(
    manifest: Manifest, index: int, which: int, data: bytes
) -> tuple[Manifest, int]:
    """Put ``data`` (framed, valid CRCs) in place of one record; a manifest that vouches for it."""
    shard = manifest.shards[index]
    records = [
        bytes(s.data or b"") for s in tfrecord.scan(Path(manifest.shard_url(shard)).read_bytes())
    ]
    records[which] = data
    framed = [b"".join(tfrecord.frame([r])) for r in records]
    return _forge(manifest, index, b"".join(framed)), sum(len(f) for f in framed[:which])


WHOLE_TEXT = b"\xff\xd8\xff\xda plain text\xff\xd9"  # JPEG markers around text: not cut short


def _example(**features: tuple[str, list]) -> bytes:  # type: ignore[type-arg]
    return encode_bytes(features)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("content", "found"),
    [
        (_example(label=("int64", [1]), path=("bytes", [b"a.jpg"])), "feature 'image' missing"),
        (  # a JPEG's start, scan and end markers around text: only decoding tells
            _example(
                image=("bytes", [WHOLE_TEXT]),
                label=("int64", [1]),
                path=("bytes", [b"a.jpg"]),
                sha256=("bytes", [hashlib.sha256(WHOLE_TEXT).hexdigest().encode()]),
            ),
            "feature 'image' of a.jpg does not decode as an image",
        ),
        (  # text under an image name: its first bytes already tell
            _example(
                image=("bytes", [b"plain text, not an image"]),
                label=("int64", [1]),
                path=("bytes", [b"a.jpg"]),
                sha256=(
                    "bytes",
                    [hashlib.sha256(b"plain text, not an image").hexdigest().encode()],
                ),
            ),
            "feature 'image' of a.jpg: expected an image (JPEG, PNG, GIF, BMP or WebP) as its "
            "name says, found bytes b'plain te'",
        ),
        (b"\x0a\x05not an example", "not a tf.train.Example"),
        (  # a feature key that is not UTF-8 ("path" with one byte changed; lengths unchanged)
            _example(
                image=("bytes", [b"\xff\xd8"]),
                label=("int64", [1]),
                path=("bytes", [b"a.jpg"]),
                sha256=("bytes", [hashlib.sha256(b"\xff\xd8").hexdigest().encode()]),
            ).replace(b"path", b"p\xffth"),
            "not a tf.train.Example: 'utf-8' codec can't decode byte 0xff",
        ),
    ],
    ids=["missing-feature", "not-an-image", "text-as-jpg", "not-an-example", "key-not-utf8"],
)
def test_malformed_record_with_valid_crcs_is_named_inside_shard_errors(
    shard_set, tmp_path, content, found
):
    manifest = _copy_shards(shard_set[0], tmp_path / "copy")
    shard = manifest.shards[6]
    forged, offset = _replace_record(manifest, 6, 2, content)
    with pytest.raises(RecordError) as info, corruption.shard_errors(forged):
        ds = loader.make_dataset(forged.shards, forged, batch_size=8, training=False)
        for _ in ds:
            pass
    assert str(info.value).startswith(
        f"{forged.shard_url(shard)}: record 2 at byte {offset}: {found}"
    )
    assert (info.value.shard, info.value.index, info.value.offset) == (shard.name, 2, offset)


_NOT_AN_IMAGE = _example(
    image=("bytes", [WHOLE_TEXT]),
    label=("int64", [1]),
    path=("bytes", [b"a.jpg"]),
    sha256=("bytes", [hashlib.sha256(WHOLE_TEXT).hexdigest().encode()]),
)


@pytest.mark.parametrize("per_record", [None, True, False])
def test_a_bad_image_in_the_dropped_last_batch_still_stops_the_read(
    shard_set, tmp_path, per_record
):
    """The 32 px set goes a batch at a time by default; the records of a dropped short batch
    are decoded all the same, as record by record decodes every record."""
    manifest = _copy_shards(shard_set[0], tmp_path / "copy")
    shard = manifest.shards[6]
    last = shard.records - 1  # one full batch of the others: the last record is dropped
    forged, offset = _replace_record(manifest, 6, last, _NOT_AN_IMAGE)
    with pytest.raises(RecordError) as info, corruption.shard_errors(forged):
        ds = loader.make_dataset(
            [forged.shards[6]], forged, batch_size=last, training=False, drop_remainder=True,
            per_record=per_record,
        )  # fmt: skip
        assert ds.element_spec[0].shape[0] == last  # a static batch dimension, as asked
        for _ in ds:
            pass
    assert str(info.value).startswith(
        f"{forged.shard_url(shard)}: record {last} at byte {offset}: "
        "feature 'image' of a.jpg does not decode as an image"
    )


def _cut_jpeg() -> bytes:
    """A real JPEG of noise, cut after 300 bytes: its header reads, its data ends early."""
    import io

    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=95)
    return out.getvalue()[:300]


CUT_JPEG = (  # what the rules say of it, naming the record the decoder refused
    "expected a whole JPEG file (ending with its end-of-image marker FF D9), found 300 bytes "
    "that stop before it: the file was cut short (an interrupted copy or download?), and "
    "TensorFlow's decoder refuses it"
)


def _cut_jpeg_record() -> bytes:
    """A record of a.jpg whose image is :func:`_cut_jpeg` (its sha256 matches: the decoder
    refuses it, the image rule tells why)."""
    cut = _cut_jpeg()
    return _example(
        image=("bytes", [cut]),
        label=("int64", [1]),
        path=("bytes", [b"a.jpg"]),
        sha256=("bytes", [hashlib.sha256(cut).hexdigest().encode()]),
    )


@pytest.mark.parametrize("image_size", [None, (8, 8)], ids=["native", "scaled-decode"])
def test_a_cut_jpeg_is_named_inside_shard_errors_on_every_decode_path(
    shard_set, tmp_path, image_size
):
    """With image_size the decode goes through the JPEG shape op, whose error reads
    "Invalid JPEG data": that is a bad record too."""
    content = _cut_jpeg_record()
    manifest = _copy_shards(shard_set[0], tmp_path / "copy")
    shard = manifest.shards[6]
    forged, offset = _replace_record(manifest, 6, 2, content)
    with pytest.raises(RecordError) as info, corruption.shard_errors(forged):
        ds = loader.make_dataset(
            [forged.shards[6]], forged, batch_size=8, training=False, image_size=image_size
        )
        for _ in ds:
            pass
    assert str(info.value).startswith(
        f"{forged.shard_url(shard)}: record 2 at byte {offset}: "
        f"feature 'image' of a.jpg: {CUT_JPEG}"
    )


@pytest.mark.parametrize("image_size", [None, (8, 8)], ids=["native", "scaled-decode"])
def test_a_cut_jpeg_read_for_the_dataset_shape_is_named_when_the_dataset_is_built(
    shard_set, tmp_path, image_size
):
    """The first record's image gives the dataset's shape: bad, it was a TensorFlow traceback
    out of make_dataset (the train stage's too), before any shard_errors could help."""
    content = _cut_jpeg_record()
    manifest = _copy_shards(shard_set[0], tmp_path / "copy")
    first = next(i for i, s in enumerate(manifest.shards) if s.records)
    forged, _ = _replace_record(manifest, first, 0, content)
    with pytest.raises(RecordError) as info:
        loader.make_dataset(
            forged.shards, forged, batch_size=8, training=False, image_size=image_size
        )
    assert str(info.value).startswith(
        f"{forged.shard_url(forged.shards[first])}: record 0 at byte 0: "
        f"feature 'image' of a.jpg: {CUT_JPEG}"
    )


def _two_sizes(tmp_path: Path) -> Manifest:
    """6 JPEGs of 8 px and 6 of 16 px in the same label folders, in one shard."""
    write_synthetic(str(tmp_path / "raw"), 6, 8, workers=1)
    write_synthetic(str(tmp_path / "more"), 6, 16, workers=1)
    for path in (tmp_path / "more").rglob("*.jpg"):  # the same folders, other names
        path.rename(tmp_path / "raw" / path.parent.name / f"big-{path.name}")
    config = WriteConfig(out=str(tmp_path / "shards"), num_shards=1, workers=1, executor="serial")
    return write(config, list_files(str(tmp_path / "raw")), progress=False).manifest


def test_images_of_two_sizes_without_image_size_are_refused_from_the_statistics(tmp_path):
    manifest = _two_sizes(tmp_path)
    with pytest.raises(ConfigError) as info:
        loader.make_dataset(manifest.shards, manifest, batch_size=12, training=False)
    assert "images of several sizes (width 8-16 px, height 8-16 px" in str(info.value)
    assert "pass image_size" in str(info.value)
    resized = loader.make_dataset(
        manifest.shards, manifest, batch_size=12, training=False, image_size=(8, 8)
    )
    assert [images.shape for images, _ in resized] == [(12, 8, 8, 3)]


def test_four_channels_of_a_jpeg_set_are_refused_when_the_dataset_is_built(shard_set):
    manifest = shard_set[0]
    with pytest.raises(ConfigError) as info:
        loader.make_dataset(manifest.shards, manifest, batch_size=8, training=False, channels=4)
    assert str(info.value) == (
        f"{manifest.directory}: channels=4 asked, but {manifest.records} of its images are "
        "JPEGs (by its image statistics), which decode to 1 or 3 channels: pass channels 1 or 3"
    )


@pytest.mark.parametrize("per_record", [None, True])
def test_images_of_two_sizes_without_statistics_are_one_line_saying_both(tmp_path, per_record):
    manifest = _two_sizes(tmp_path)
    (Path(manifest.directory) / "imagestats.json").unlink()  # found while decoding, then
    with pytest.raises(ConfigError) as info, corruption.shard_errors(manifest):
        ds = loader.make_dataset(
            manifest.shards, manifest, batch_size=12, training=False, per_record=per_record
        )
        for _ in ds:
            pass
    message = str(info.value)
    assert "\n" not in message and "pass image_size" in message
    assert "(8, 8, 3)" in message and "(16, 16, 3)" in message


def test_dropping_the_short_batch_keeps_every_full_one(shard_set):
    manifest, _ = shard_set
    kw = {"batch_size": 8, "training": False, "features": ["sha256"], "drop_remainder": True}
    by_batch = [
        b[0]["sha256"].numpy().tolist()
        for b in loader.make_dataset(manifest.shards, manifest, **kw)
    ]
    by_record = loader.make_dataset(manifest.shards, manifest, per_record=True, **kw)
    assert by_batch == [b[0]["sha256"].numpy().tolist() for b in by_record]
    assert len(by_batch) == IMAGES // 8 and all(len(b) == 8 for b in by_batch)


# ----------------------------------------------------------------------------- epoch order


def _paths(ds) -> list[bytes]:  # type: ignore[no-untyped-def]
    return [p for features, _ in ds for p in features["path"].numpy().tolist()]


def test_a_stream_started_at_a_position_is_the_rest_of_the_uninterrupted_one(shard_set):
    manifest, _ = shard_set
    kw = {"batch_size": 10, "training": True, "seed": 2, "features": ["path"], "decode": False}
    whole = _paths(loader.make_dataset(manifest.shards, manifest, **kw).take(50))  # 2.5 epochs
    for steps in (3, 20, 27):
        start = Position.after(steps * 10, IMAGES)
        rest = loader.make_dataset(manifest.shards, manifest, start=start, **kw)
        assert _paths(rest.take(50 - steps)) == whole[steps * 10 :]
        one = loader.make_dataset(manifest.shards, manifest, start=start, repeat=False, **kw)
        assert len(one) == -(-(IMAGES - start.record) // 10)
        assert _paths(one) == whole[steps * 10 : (start.epoch + 1) * IMAGES]


def test_a_start_past_an_epoch_and_a_worker_with_no_record_are_refused(shard_set):
    """Past the end, a stream silently skipped to the next epoch (or went negative without
    repeat); a worker with 0 records an epoch read empty epochs forever."""
    manifest, _ = shard_set
    kw = {"batch_size": 10, "training": True, "decode": False}
    with pytest.raises(ConfigError) as past:
        loader.make_dataset(manifest.shards, manifest, start=(0, IMAGES), **kw)
    assert str(past.value) == (
        f"start (0, {IMAGES}): an epoch holds {IMAGES} records, so record {IMAGES} is past "
        f"its end; Position.after(records read, {IMAGES}) gives the position"
    )
    per = IMAGES // 3
    with pytest.raises(ConfigError, match=rf"holds {per} records for each of 3 workers"):
        loader.make_dataset(manifest.shards, manifest, start=(1, per), worker=(2, 3), **kw)
    last = loader.make_dataset(manifest.shards, manifest, start=(1, per - 1), worker=(2, 3), **kw)
    assert next(iter(last)) is not None
    with pytest.raises(ConfigError, match=rf"give each of {IMAGES + 1} workers 0 records"):
        loader.make_dataset(manifest.shards, manifest, worker=(0, IMAGES + 1), **kw)
    import tensorflow as tf

    both = {"worker": (0, 2), "input_context": tf.distribute.InputContext(4, 3, 4)}
    with pytest.raises(ConfigError, match="pass worker or input_context, not both"):
        loader.make_dataset(manifest.shards, manifest, **both, **kw)


def test_the_buffer_order_is_still_there_and_cannot_seek(shard_set):
    manifest, truth = shard_set
    kw = {"batch_size": 16, "training": True, "order": "buffer", "decode": False}
    ds = loader.make_dataset(manifest.shards, manifest, repeat=False, features=["sha256"], **kw)
    assert _collect(ds) == collections.Counter(dict.fromkeys(truth, 1))
    with pytest.raises(ConfigError, match="start and worker"):
        loader.make_dataset(manifest.shards, manifest, start=(0, 5), **kw)


@pytest.fixture(scope="module")
def sixteen_shards(tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    """301 synthetic 8 px PNGs in 16 shards (301 = 2 * 150 + 1 = 3 * 100 + 1)."""
    base = tmp_path_factory.mktemp("sixteen")
    write_synthetic(str(base / "img"), 301, 8, fmt="png", workers=1)
    config = WriteConfig(out=str(base / "shards"), num_shards=16, workers=1, executor="serial")
    return write(config, list_files(str(base / "img")), progress=False).manifest


@pytest.mark.parametrize("count", [2, 3])
def test_workers_read_disjoint_equal_parts_of_the_epoch(sixteen_shards, count):
    import tensorflow as tf

    manifest = sixteen_shards
    assert len(manifest.shards) == 16 and manifest.records == 301
    kw = {"batch_size": 7, "training": True, "repeat": False, "features": ["path"]}
    parts = []
    for index in range(count):
        context = tf.distribute.InputContext(count, index, count)
        ds = loader.make_dataset(
            manifest.shards, manifest, decode=False, input_context=context, **kw
        )
        parts.append(_paths(ds))
        per = 301 // count
        assert len(ds) == -(-per // 7)  # one pass keeps its partial batch
        steps = loader.steps_per_epoch(manifest.shards, 7, worker=(index, count))
        assert steps == per // 7
    union = [p for part in parts for p in part]
    assert {len(p) for p in parts} == {301 // count}
    assert len(set(union)) == len(union) == 301 - 301 % count
    every = _paths(loader.make_dataset(manifest.shards, manifest, decode=False, **kw))
    assert union == every[: len(union)]


@pytest.mark.parametrize("count", [1, 3])
def test_a_pass_knows_its_batches_for_any_worker_and_start(sixteen_shards, count):
    manifest = sixteen_shards
    per = 301 // count  # a worker's training records of an epoch
    kw = {"repeat": False, "decode": False, "features": ["path"]}
    for index in sorted({0, count - 1}):
        worker = (index, count)
        for batch, done, drop in ((7, 0, False), (7, 5, False), (7, 5, True), (10, 3, False)):
            start = Position.after(done * batch, per)
            ds = loader.make_dataset(
                manifest.shards,
                manifest,
                batch_size=batch,
                training=True,
                start=start,
                worker=worker,
                drop_remainder=drop,
                **kw,
            )
            left = per - start.record
            expected = left // batch if drop else -(-left // batch)
            assert len(ds) == expected == sum(1 for _ in ds), (worker, batch, done, drop)


def test_gzip_shards_are_read_whole_in_the_epoch_order(tmp_path):
    write_synthetic(str(tmp_path / "img"), 60, 8, fmt="png", workers=1)
    config = WriteConfig(
        out=str(tmp_path / "shards"), num_shards=4, workers=1, executor="serial", compression="gzip"
    )
    manifest = write(config, list_files(str(tmp_path / "img")), progress=False).manifest
    kw = {"batch_size": 8, "training": True, "features": ["path"], "decode": False}
    whole = _paths(loader.make_dataset(manifest.shards, manifest, **kw).take(15))  # 2 epochs
    assert len(set(whole[:60])) == len(set(whole[60:120])) == 60 and whole[:60] != whole[60:]
    rest = loader.make_dataset(manifest.shards, manifest, start=Position(1, 13), **kw)
    assert _paths(rest.take(5)) == whole[73:113]


def _image_record(image: bytes, path: bytes) -> bytes:
    return _example(
        image=("bytes", [image]),
        label=("int64", [1]),
        path=("bytes", [path]),
        sha256=("bytes", [hashlib.sha256(image).hexdigest().encode()]),
    )


def test_of_two_images_tensorflow_refuses_the_one_its_error_describes_is_named(shard_set, tmp_path):
    """A scan stopping at the first bad record named a.jpg where TensorFlow had failed on
    b.png: its words ("Invalid PNG data, size N") say which one it was."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(out, "PNG")
    png = out.getvalue()[:-4] + bytes(4)  # IEND's CRC zeroed: whole to write, refused by TF
    manifest = _copy_shards(shard_set[0], tmp_path / "copy")
    forged, _ = _replace_record(manifest, 6, 1, _image_record(WHOLE_TEXT, b"a.jpg"))
    forged, offset = _replace_record(forged, 6, 3, _image_record(png, b"b.png"))
    said = f"Map: Invalid PNG data, size {len(png)}\n\t [[{{{{node DecodeImage}}}}]] [Op:Next]"
    found = corruption.find_corrupt_record(forged, decode_images=True, said=said)
    assert str(found).startswith(
        f"{forged.shard_url(forged.shards[6])}: record 3 at byte {offset}: "
        "feature 'image' of b.png does not decode as an image: Invalid PNG data, size "
    )
    first = corruption.find_corrupt_record(forged, decode_images=True)
    assert "feature 'image' of a.jpg does not decode" in str(first)  # without TF's words
