"""Image decoding: scaled JPEG decode picks the right DCT ratio; both loader paths agree."""

from __future__ import annotations

import dataclasses
import io
import re
import shutil

import numpy as np
import pytest
from PIL import Image

from tfshards.listing.listing import list_files
from tfshards.project.sample import SyntheticSpec, render_synthetic, write_synthetic
from tfshards.reading import loader
from tfshards.reading.decode import decode_image
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write


def _jpeg(size: int) -> bytes:
    return render_synthetic(SyntheticSpec(count=1, size=size, fmt="jpeg"), 0)


@pytest.mark.parametrize(
    ("target", "decoded_side"),
    [(300, 512), (256, 256), (224, 256), (129, 256), (128, 128), (100, 128), (64, 64), (40, 64)],
)
def test_scaled_jpeg_decodes_at_the_smallest_scale_that_covers_the_target(target, decoded_side):
    import tensorflow as tf

    from tfshards.reading.decode import _scaled_jpeg

    image = _scaled_jpeg(tf.constant(_jpeg(512)), (target, target, 3))
    assert tuple(image.shape) == (decoded_side, decoded_side, 3)


def test_scaled_decode_is_close_to_a_full_decode_and_has_the_target_shape():
    import tensorflow as tf

    data = tf.constant(_jpeg(512))
    scaled = decode_image(data, (224, 224, 3), resize=True).numpy()
    full = decode_image(data, (224, 224, 3), resize=True, scaled=False).numpy()
    assert scaled.shape == full.shape == (224, 224, 3)
    assert 0.0 < np.abs(scaled - full).mean() < 0.02  # in [0, 1] units: under 2%


def test_non_jpeg_images_decode_whole_whatever_scaled_says():
    import tensorflow as tf

    buf = io.BytesIO()
    Image.fromarray(np.arange(64 * 64 * 3, dtype=np.uint8).reshape(64, 64, 3)).save(buf, "PNG")
    data = tf.constant(buf.getvalue())
    a = decode_image(data, (16, 16, 3), resize=True).numpy()
    b = decode_image(data, (16, 16, 3), resize=True, scaled=False).numpy()
    np.testing.assert_array_equal(a, b)


@pytest.fixture(scope="module")
def large_set(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    base = tmp_path_factory.mktemp("large")
    write_synthetic(str(base / "img"), 24, 256, workers=1)
    config = WriteConfig(out=str(base / "shards"), num_shards=3, executor="serial")
    return write(config, list_files(str(base / "img")), progress=False).manifest


@pytest.mark.parametrize("scaled", [True, False])
def test_per_record_and_per_batch_paths_give_the_same_batches(large_set, scaled):
    def read(per_record: bool) -> list[tuple[np.ndarray, np.ndarray]]:
        ds = loader.make_dataset(
            large_set.shards,
            large_set,
            batch_size=5,
            training=False,
            image_size=(64, 64),
            channels=3,
            scaled_decode=scaled,
            per_record=per_record,
        )
        return [(x.numpy(), y.numpy()) for x, y in ds]

    by_record, by_batch = read(True), read(False)
    assert [x.shape for x, _ in by_record] == [(5, 64, 64, 3)] * 4 + [(4, 64, 64, 3)]
    assert len(by_record) == len(by_batch)
    for (xa, ya), (xb, yb) in zip(by_record, by_batch, strict=True):
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_allclose(xa, xb, atol=1e-6)


@pytest.fixture(scope="module")
def small_set(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    base = tmp_path_factory.mktemp("small")
    write_synthetic(str(base / "img"), 12, 48, workers=1)
    config = WriteConfig(out=str(base / "shards"), num_shards=2, executor="serial")
    return write(config, list_files(str(base / "img")), progress=False).manifest


def _batches(manifest, side: int, scaled: bool, per_record: bool | None = None) -> np.ndarray:  # type: ignore[no-untyped-def]
    ds = loader.make_dataset(
        manifest.shards,
        manifest,
        batch_size=4,
        training=False,
        image_size=(side, side),
        channels=3,
        scaled_decode=scaled,
        per_record=per_record,
    )
    return np.concatenate([x.numpy() for x, _ in ds])


@pytest.mark.parametrize("per_record", [True, False])
def test_images_under_twice_the_target_decode_whole_as_the_switch_would(small_set, per_record):
    import tensorflow as tf

    # 48 px read at 32 and at 48: the plan leaves the switch out; the switch would pick 1/1.
    for side in (32, 48):
        read = _batches(small_set, side, True, per_record)
        np.testing.assert_array_equal(read, _batches(small_set, side, False, per_record))
        data = tf.constant(_jpeg(48))
        switched = decode_image(data, (side, side, 3), resize=True).numpy()
        whole = decode_image(data, (side, side, 3), resize=True, scaled=False).numpy()
        np.testing.assert_array_equal(switched, whole)


def test_a_set_twice_the_target_is_decoded_scaled(large_set):
    # 256 px read at 64: decoded at 1/4 scale, pixels a little off the full decode
    scaled, whole = _batches(large_set, 64, True), _batches(large_set, 64, False)
    assert scaled.shape == whole.shape == (24, 64, 64, 3)
    assert 0.0 < np.abs(scaled - whole).mean() < 0.02


def _mixed_set(base):  # type: ignore[no-untyped-def]
    write_synthetic(str(base / "img"), 12, 48, workers=1)
    write_synthetic(str(base / "img"), 4, 48, fmt="png", workers=1, classes=2, seed=9)
    config = WriteConfig(out=str(base / "shards"), num_shards=2, executor="serial")
    return write(config, list_files(str(base / "img")), progress=False).manifest


def _formats(manifest):  # type: ignore[no-untyped-def]
    from tfshards.reading.decode import stored_stats

    stats = stored_stats(manifest)
    return None if stats is None else stats.formats


def test_the_stored_formats_come_from_the_versions_statistics(small_set, tmp_path):
    assert _formats(small_set) == {"JPEG": 12}
    mixed = _formats(_mixed_set(tmp_path))
    assert mixed is not None and mixed["JPEG"] > 0 and mixed["PNG"] > 0
    (tmp_path / "none").mkdir()  # a version without statistics: formats unknown
    assert _formats(dataclasses.replace(small_set, root=str(tmp_path / "none"))) is None


def _stats(formats: dict[str, int], channels: dict[str, int]):  # type: ignore[no-untyped-def]
    from tfshards.shardset.imagestats import ImageStats

    return ImageStats(formats=formats, channels=channels)


@pytest.mark.parametrize(
    ("formats", "channels", "expected"),
    [
        ({"PNG": 5}, {"1": 5}, 1),
        ({"JPEG": 5}, {"3": 5}, 3),
        ({"PNG": 5}, {"4": 5}, 4),
        ({"JPEG": 1, "PNG": 4}, {"4": 5}, 3),  # a CMYK JPEG: decode_jpeg gives 1 or 3
        ({"PNG": 4, "GIF": 1}, {"1": 4, "3": 1}, 3),  # mixed: colour wins
        ({"PNG": 5}, {"1": 4, "2": 1}, 1),  # grey, some with alpha
        ({"PNG": 5}, {"2": 5}, 1),
        ({"PNG": 4, "GIF": 1}, {"1": 4, "unknown": 1}, 1),  # a header that did not tell
        ({"JPEG": 1, "PNG": 3, "GIF": 1}, {"1": 3, "3": 1, "unknown": 1}, 3),
        ({"JPEG": 5}, {"unknown": 5}, None),
        ({"PNG": 5}, {"1": 0, "3": 5}, 3),
    ],
)
def test_the_common_channels_are_the_one_count_or_3(formats, channels, expected):
    from tfshards.reading.decode import common_channels

    assert common_channels(_stats(formats, channels)) == expected
    assert common_channels(None) is None


def test_a_grayscale_first_record_does_not_make_a_colour_set_gray(tmp_path):
    """The first record of the only shard is a grayscale PNG (seed 5 shuffles it first);
    the set also holds colour JPEGs and a GIF. Every image reads at 3 channels: the first
    image's 1 made the GIF stop the read, and the colour images gray."""
    raw = tmp_path / "img"
    write_synthetic(str(raw), 6, 16, workers=1, classes=1)
    Image.new("L", (16, 16), 90).save(raw / "00" / "0-gray.png")
    Image.new("RGB", (16, 16), (200, 10, 10)).save(raw / "00" / "z-red.gif")
    config = WriteConfig(out=str(tmp_path / "shards"), num_shards=1, executor="serial", seed=5)
    manifest = write(config, list_files(str(raw)), progress=False).manifest
    assert _formats(manifest) == {"GIF": 1, "JPEG": 6, "PNG": 1}
    ds = loader.make_dataset(
        manifest.shards, manifest, batch_size=8, image_size=(16, 16), training=False
    )
    ((images, _),) = list(ds)
    assert images.shape == (8, 16, 16, 3)
    assert images.numpy().std(axis=-1).max() > 0.1  # colour kept: not three equal planes


@pytest.mark.parametrize("size", [48, 512])
@pytest.mark.parametrize("channels", [1, 3])
def test_decode_jpeg_gives_the_pixels_of_decode_image(size, channels):
    import tensorflow as tf

    data = tf.constant(_jpeg(size))
    for resize, side in ((False, size), (True, size // 2)):
        shape = (side, side, channels)
        sniffed = decode_image(data, shape, resize=resize, scaled=False).numpy()
        direct = decode_image(data, shape, resize=resize, scaled=False, jpeg=True).numpy()
        np.testing.assert_array_equal(sniffed, direct)
    shape = (size // 4, size // 4, channels)  # the scaled decode, with and without the switch
    np.testing.assert_array_equal(
        decode_image(data, shape, resize=True).numpy(),
        decode_image(data, shape, resize=True, jpeg=True).numpy(),
    )


def test_a_set_of_jpegs_and_pngs_still_reads_every_image(tmp_path):
    mixed = _mixed_set(tmp_path)
    read = _batches(mixed, 48, True)
    assert read.shape == (mixed.records, 48, 48, 3)


def test_the_loader_decodes_an_all_jpeg_set_with_decode_jpeg_and_a_mixed_one_sniffing(
    small_set, tmp_path, monkeypatch
):
    asked: list[bool] = []

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        asked.append(kwargs["jpeg"])
        return decode_image(*args, **kwargs)

    monkeypatch.setattr(loader, "decode_image", recording)
    _batches(small_set, 48, True, per_record=True)  # the path that decodes with decode_image
    _batches(_mixed_set(tmp_path), 48, True, per_record=True)
    assert asked == [True, False]  # each dataset's map traced once


_COUNT = re.compile(rb'("formats":\{"JPEG":)(\d+)')  # a bucket's JPEG count


@pytest.mark.parametrize(
    "edit",
    [
        lambda doc: _COUNT.sub(lambda m: m[1] + b"%d" % (int(m[2]) - 1), doc, 1),  # one short
        lambda doc: _COUNT.sub(rb"\1-\2", doc, 1),
        lambda doc: _COUNT.sub(rb"\1true", doc, 1),
        lambda doc: _COUNT.sub(rb'\1"\2"', doc, 1),  # the right count, as a string
        lambda doc: _COUNT.sub(rb"\1\2.0", doc, 1),  # the right count, as a float
        lambda doc: _COUNT.sub(rb"\1Infinity", doc, 1),
        lambda doc: b"[" * 100_000 + b"]" * 100_000,  # nested past the recursion limit
    ],
)
def test_statistics_edited_out_of_true_leave_the_formats_unknown(small_set, tmp_path, edit):
    copy = tmp_path / "copy"
    shutil.copytree(small_set.directory, copy)
    stats = copy / "imagestats.json"
    edited = edit(stats.read_bytes())
    assert edited != stats.read_bytes()
    stats.write_bytes(edited)
    assert _formats(dataclasses.replace(small_set, root=str(copy))) is None


@pytest.mark.parametrize(
    "data",
    [b"[" * 100_000 + b"]" * 100_000, b'{"version": 1, "buckets": {"0": {"images": 1e400}}}'],
)
def test_statistics_past_the_parsers_limits_are_one_line(data):
    from tfshards.errors import InputError
    from tfshards.shardset.imagestats import VersionStats

    with pytest.raises(InputError, match=r"^stats\.json: not an image statistics file: "):
        VersionStats.from_json(data, "stats.json")
