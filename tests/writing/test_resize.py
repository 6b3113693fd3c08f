"""Images resized once when writing: geometry, formats, determinism, the writer and the loader."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from tfshards.cli import app
from tfshards.errors import ConfigError, InputError
from tfshards.project.sample import SyntheticSpec, render_synthetic
from tfshards.reading import loader
from tfshards.shardset.manifest import Manifest
from tfshards.shardset.resize import JPEG_QUALITY, Resize
from tfshards.validation.validate import ValidateConfig, validate
from tfshards.writing.config import WriteConfig
from tfshards.writing.resize import resize_image


def _encoded(pixels: np.ndarray, fmt: str = "PNG", mode: str | None = None) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels, mode).save(buf, fmt)
    return buf.getvalue()


def _decoded(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


# ----------------------------------------------------------------------------- one image


def test_an_image_of_any_aspect_is_stretched_to_the_square_not_cropped():
    left_red = np.zeros((50, 200, 3), np.uint8)
    left_red[:, :100, 0] = 255  # left half red, right half black: 4:1 wide
    image = _decoded(resize_image(_encoded(left_red), Resize(32, "raw")))
    assert image.format == "BMP" and image.size == (32, 32) and image.mode == "RGB"
    pixels = np.asarray(image)
    # Both halves survive (a centre crop would keep only the middle); rows are alike.
    assert pixels[:, :14, 0].min() == 255 and pixels[:, 18:, 0].max() == 0
    assert (pixels == pixels[:1]).all()


def test_jpeg_format_is_a_baseline_jpeg_at_the_fixed_quality():
    data = resize_image(render_synthetic(SyntheticSpec(count=1, size=96), 0), Resize(40))
    image = _decoded(data)
    assert image.format == "JPEG" and image.size == (40, 40)
    assert "progressive" not in image.info and "exif" not in image.info
    assert Resize(40).params()["quality"] == JPEG_QUALITY


def test_grey_stays_grey_and_every_other_mode_becomes_rgb():
    grey = np.arange(64 * 64, dtype=np.uint16).reshape(64, 64).astype(np.uint8)
    rgba = np.full((64, 64, 4), 200, np.uint8)
    assert _decoded(resize_image(_encoded(grey), Resize(16, "raw"))).mode == "L"
    assert _decoded(resize_image(_encoded(grey), Resize(16))).mode == "L"
    assert _decoded(resize_image(_encoded(rgba, mode="RGBA"), Resize(16, "raw"))).mode == "RGB"


def test_raw_pixels_decode_in_tensorflow_to_what_pillow_resized():
    import tensorflow as tf

    source = _encoded(np.random.default_rng(0).integers(0, 256, (80, 60, 3), dtype=np.uint8))
    stored = resize_image(source, Resize(24, "raw"))
    expected = np.asarray(_decoded(source).resize((24, 24), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(tf.io.decode_image(stored).numpy(), expected)


def test_bytes_that_do_not_decode_are_an_input_error():
    with pytest.raises(InputError, match="cannot decode as an image to resize"):
        resize_image(b"\xff\xd8\xff\xe0 then not a JPEG at all", Resize(16))


@pytest.mark.parametrize(("size", "fmt"), [(0, "jpeg"), (-3, "raw"), (10**6, "jpeg"), (8, "png")])
def test_bad_size_or_format_is_a_config_error(size, fmt):
    with pytest.raises(ConfigError, match="resize"):
        Resize(size, fmt)
    with pytest.raises(ConfigError, match="resize"):
        WriteConfig(out="x", resize=size, resize_format=fmt)


def _resize_all(pair: tuple[list[bytes], str]) -> list[bytes]:
    sources, fmt = pair
    return [resize_image(s, Resize(56, fmt)) for s in sources]


@pytest.mark.parametrize("fmt", ["jpeg", "raw"])
def test_encoder_output_is_identical_across_threads_and_processes(fmt):
    sources = [render_synthetic(SyntheticSpec(count=8, size=128), i) for i in range(8)]
    here = _resize_all((sources, fmt))
    with ThreadPoolExecutor(8) as threads:
        in_threads = list(threads.map(lambda s: resize_image(s, Resize(56, fmt)), sources))
    with ProcessPoolExecutor(2) as processes:
        halves = processes.map(_resize_all, [(sources[:4], fmt), (sources[4:], fmt)])
        in_processes = [b for half in halves for b in half]
    assert here == in_threads == in_processes


# ----------------------------------------------------------------------------- writer


@pytest.fixture
def raw_tree(shared_raw: Callable[..., Path]) -> str:
    return str(shared_raw(24, 64, classes=3))


@pytest.fixture
def write_options() -> dict[str, object]:
    return {"num_shards": 4}


def _shard_bytes(m: Manifest) -> list[bytes]:
    return [Path(m.shard_url(s)).read_bytes() for s in m.shards]


@pytest.mark.parametrize("fmt", ["jpeg", "raw"])
def test_resized_sets_are_byte_identical_with_1_2_and_8_workers(write_set, raw_tree, tmp_path, fmt):
    runs = [
        write_set(
            raw_tree, tmp_path / f"{n}-{ex}", resize=16, resize_format=fmt, workers=n, executor=ex
        )
        for n, ex in ((1, "serial"), (2, "process"), (8, "thread"))
    ]
    first = runs[0]
    for other in runs[1:]:
        assert other.fingerprint == first.fingerprint
        assert _shard_bytes(other) == _shard_bytes(first)
        assert other.to_json().replace(other.root.encode(), first.root.encode()) == first.to_json()


def test_resize_is_recorded_in_the_manifest_and_names_a_new_version(write_set, raw_tree, tmp_path):
    plain = write_set(raw_tree, tmp_path / "plain")
    jpeg = write_set(raw_tree, tmp_path / "jpeg", resize=16)
    raw = write_set(raw_tree, tmp_path / "raw", resize=16, resize_format="raw")
    assert "resize" not in plain.params
    assert len({plain.fingerprint, jpeg.fingerprint, raw.fingerprint}) == 3
    doc = json.loads(Path(jpeg.root, "manifest.json").read_bytes())
    assert doc["params"]["resize"]["size"] == 16 and doc["params"]["resize"]["format"] == "jpeg"
    assert doc["params"]["resize"]["encoder"].startswith("pillow ")
    assert Resize.from_params(raw.params) == Resize(16, "raw")
    assert Resize.from_params(plain.params) is None


def test_resized_records_hold_the_resized_image_and_its_sha256_and_validate(
    write_set, raw_tree, tmp_path
):
    import tensorflow as tf

    m = write_set(raw_tree, tmp_path / "out", resize=16, resize_format="raw")
    first = next(iter(tf.data.TFRecordDataset(m.shard_url(m.shards[0]))))
    example = tf.train.Example.FromString(first.numpy()).features.feature
    payload = example["image"].bytes_list.value[0]
    path = example["path"].bytes_list.value[0].decode()
    assert payload == resize_image(Path(raw_tree, path).read_bytes(), Resize(16, "raw"))
    import hashlib

    assert example["sha256"].bytes_list.value[0].decode() == hashlib.sha256(payload).hexdigest()
    report = validate(
        ValidateConfig(manifest=str(Path(m.root, "manifest.json")), decode_images=True)
    )
    assert report.ok and report.records == 24


def test_a_file_that_does_not_decode_is_skipped_with_its_reason(write_set, raw_tree, tmp_path):
    import shutil

    raw = tmp_path / "raw"
    shutil.copytree(raw_tree, raw)
    (raw / "00" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0" + bytes(200))
    m = write_set(str(raw), tmp_path / "out", resize=16, on_error="skip")
    assert [r.path for r in m.rejected] == ["00/broken.jpg"]
    # Pillow's words, without the address of the bytes it read (it made the manifest
    # differ from run to run)
    assert m.rejected[0].reason == "cannot decode as an image to resize: cannot identify image file"
    assert m.records == 24


# ----------------------------------------------------------------------------- loader


@pytest.mark.parametrize("fmt", ["jpeg", "raw"])
def test_loader_decodes_a_set_at_its_stored_size_without_resizing(
    write_set, raw_tree, tmp_path, fmt
):
    import tensorflow as tf

    m = write_set(raw_tree, tmp_path / "out", resize=16, resize_format=fmt)
    data = loader.make_dataset(
        m.shards, m, batch_size=24, training=False, image_size=(16, 16), image_dtype="uint8"
    )
    images, _ = next(iter(data))
    stored = loader.make_dataset(
        m.shards, m, batch_size=24, training=False, decode=False, features=["image"]
    )
    encoded = next(iter(stored))[0]["image"]
    expected = np.stack([tf.io.decode_image(e, channels=3).numpy() for e in encoded])
    np.testing.assert_array_equal(images.numpy(), expected)  # decoded, never resized


def test_loader_trusts_the_stored_size_and_never_resizes_at_it(write_set, raw_tree, tmp_path):
    import dataclasses

    import tensorflow as tf

    m = write_set(raw_tree, tmp_path / "out", resize=20, resize_format="raw")
    params = {**m.params, "resize": {**m.params["resize"], "size": 16}}  # says 16, holds 20
    told = dataclasses.replace(m, params=params)
    data = loader.make_dataset(told.shards, told, batch_size=8, training=False, image_size=(16, 16))
    with pytest.raises(tf.errors.InvalidArgumentError, match="20,20,3"):
        next(iter(data))  # a loader that resized would hand out 16 x 16 images


def test_loader_resizes_a_set_read_at_another_size(write_set, raw_tree, tmp_path):
    m = write_set(raw_tree, tmp_path / "out", resize=16, resize_format="raw")
    data = loader.make_dataset(m.shards, m, batch_size=8, training=False, image_size=(8, 8))
    images, _ = next(iter(data))
    assert tuple(images.shape) == (8, 8, 8, 3)


# ----------------------------------------------------------------------------- CLI


def test_cli_write_resize_writes_the_stored_size_and_rejects_a_bad_format(raw_tree, tmp_path):
    runner = CliRunner()
    listing = tmp_path / "listing"
    assert runner.invoke(app, ["list", raw_tree, "--out", str(listing)]).exit_code == 0
    base = ["write", str(listing), "--out", str(tmp_path / "s"), "--manifest", str(tmp_path / "m")]
    done = runner.invoke(app, [*base, "--resize", "16", "--num-shards", "2", "--no-progress"])
    assert done.exit_code == 0, done.output
    assert Resize.from_params(Manifest.from_json((tmp_path / "m").read_bytes()).params) == Resize(
        16
    )
    bad = runner.invoke(app, [*base, "--resize", "16", "--resize-format", "png"])
    assert bad.exit_code == 1
    assert bad.output.strip().splitlines()[-1].endswith("got 'png'")
    assert "Traceback" not in bad.output
    help_text = runner.invoke(app, ["write", "--help"]).output
    assert "--resize" in help_text and "--resize-format" in help_text


# ----------------------------------------------------------------------------- 16-bit and odd modes


def _png16(samples: np.ndarray) -> bytes:
    """A real 16-bit PNG of ``samples`` (uint16, H x W x C), encoded by TensorFlow."""
    import tensorflow as tf

    return tf.io.encode_png(tf.constant(samples, tf.uint16)).numpy()


def _tf_uint8(data: bytes) -> np.ndarray:
    import tensorflow as tf

    return tf.io.decode_png(data, dtype=tf.uint8).numpy()


def _ramp(height: int, width: int, channels: int) -> np.ndarray:
    """Every 16-bit value from 0 to 65535, in H x W x C."""
    total = height * width * channels
    values = np.linspace(0, 0xFFFF, total).round().astype(np.uint16)
    return np.random.default_rng(1).permutation(values).reshape(height, width, channels)


def test_a_16_bit_grey_png_by_pillow_is_stored_as_tensorflow_decodes_it():
    ramp = np.linspace(0, 0xFFFF, 64 * 64).round().astype(np.uint16).reshape(64, 64)
    source = _encoded(ramp)  # Pillow writes a uint16 array as a 16-bit grey PNG (mode I;16)
    assert _decoded(source).mode == "I;16"
    stored = _decoded(resize_image(source, Resize(64, "raw")))  # the same size: no filter
    expected = _tf_uint8(source)[..., 0]
    assert stored.mode == "L"
    np.testing.assert_array_equal(np.asarray(stored), expected)
    assert abs(np.asarray(stored).mean() - 127.5) < 0.6  # not near-white (a clipped 254.5)


@pytest.mark.parametrize(("channels", "mode"), [(2, "L"), (3, "RGB"), (4, "RGB")])
def test_16_bit_grey_alpha_rgb_and_rgba_pngs_are_stored_as_tensorflow_decodes_them(channels, mode):
    source = _png16(_ramp(48, 40, channels))
    stored = _decoded(resize_image(source, Resize(40, "raw")))  # stretched 48 -> 40 rows
    expected = _tf_uint8(source)[..., : {2: 1, 3: 3, 4: 3}[channels]]  # alpha dropped
    assert stored.mode == mode
    want = Image.fromarray(expected.squeeze(-1) if mode == "L" else expected)
    want = want.resize((40, 40), Image.Resampling.BILINEAR)
    np.testing.assert_array_equal(np.asarray(stored), np.asarray(want))


def _tiff(samples: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(samples).save(buf, "TIFF")
    return buf.getvalue()


def test_mode_i_pixels_are_taken_as_16_bit_samples():
    samples = np.array([[0, 255, 256, 32895], [32896, 65280, 65535, 4660]], np.int32)
    source = _tiff(samples)
    assert _decoded(source).mode == "I"
    stored = _decoded(resize_image(source, Resize(4, "raw")))  # 2 rows stretched to 4
    assert stored.mode == "L"
    want = Image.fromarray((samples >> 8).astype(np.uint8)).resize(
        (4, 4), Image.Resampling.BILINEAR
    )
    np.testing.assert_array_equal(np.asarray(stored), np.asarray(want))


@pytest.mark.parametrize(
    ("samples", "found"),
    [
        (
            np.array([[-1, 5], [7, 9]], np.int32),
            "mode I: expected 16-bit samples 0..65535, found -1..9",
        ),
        (np.array([[0.5, 1.0], [0.0, 0.25]], np.float32), "mode F (float pixels)"),
    ],
)
def test_pixels_with_no_8_bit_scale_are_refused_naming_the_mode(samples, found):
    with pytest.raises(InputError, match=re.escape(found)):
        resize_image(_tiff(samples), Resize(2, "raw"))


def test_a_16_bit_png_written_resized_validates_and_holds_tensorflows_pixels(write_set, tmp_path):
    raw = tmp_path / "raw" / "scans"
    raw.mkdir(parents=True)
    ramp = np.linspace(0, 0xFFFF, 32 * 32).round().astype(np.uint16).reshape(32, 32)
    (raw / "a.png").write_bytes(_encoded(ramp))
    (raw / "b.png").write_bytes(_png16(_ramp(32, 32, 3)))
    m = write_set(
        str(tmp_path / "raw"), tmp_path / "out", resize=32, resize_format="raw", num_shards=1
    )
    assert m.records == 2 and not m.rejected
    import tensorflow as tf

    for record in tf.data.TFRecordDataset(m.shard_url(m.shards[0])):
        feature = tf.train.Example.FromString(record.numpy()).features.feature
        path = feature["path"].bytes_list.value[0].decode()
        stored = tf.io.decode_image(feature["image"].bytes_list.value[0]).numpy()
        expected = _tf_uint8((tmp_path / "raw" / path).read_bytes())
        np.testing.assert_array_equal(stored, expected)
    report = validate(
        ValidateConfig(manifest=str(Path(m.root, "manifest.json")), decode_images=True)
    )
    assert report.ok


def test_a_float_tiff_is_refused_in_one_line_naming_the_file_and_its_mode(tmp_path):
    raw = tmp_path / "raw" / "scans"
    raw.mkdir(parents=True)
    (raw / "depth.tif").write_bytes(_tiff(np.zeros((8, 8), np.float32)))
    runner = CliRunner()
    listing = tmp_path / "listing"
    listed = runner.invoke(
        app, ["list", str(tmp_path / "raw"), "--out", str(listing), "--extensions", ".tif"]
    )
    assert listed.exit_code == 0, listed.output
    done = runner.invoke(
        app,
        [
            "write",
            str(listing),
            "--out",
            str(tmp_path / "s"),
            "--manifest",
            str(tmp_path / "m.json"),
            "--resize",
            "8",
            "--no-progress",
        ],
    )
    assert done.exit_code == 1
    lines = done.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.output
    assert "scans/depth.tif: cannot resize an image of mode F (float pixels)" in lines[0]


def test_an_image_over_pillows_bomb_limit_is_refused_without_printing_a_warning(
    write_set, tmp_path, monkeypatch, capfd
):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 40 * 40 - 1)  # Pillow's check, a lower limit
    raw = tmp_path / "raw" / "photos"
    raw.mkdir(parents=True)
    (raw / "big.png").write_bytes(_encoded(np.zeros((40, 40, 3), np.uint8)))
    (raw / "small.png").write_bytes(_encoded(np.zeros((39, 40, 3), np.uint8)))
    m = write_set(
        str(tmp_path / "raw"),
        tmp_path / "out",
        resize=8,
        on_error="skip",
        num_shards=1,
        executor="serial",
    )
    assert m.records == 1 and [r.path for r in m.rejected] == ["photos/big.png"]
    assert m.rejected[0].reason.startswith("image too large to resize: Image size (1600 pixels)")
    assert "DecompressionBombWarning" not in capfd.readouterr().err
