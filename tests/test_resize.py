"""Images resized once when writing: geometry, formats, determinism, the writer and the loader."""

from __future__ import annotations

import io
import json
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from tfshards.cli import app
from tfshards.errors import ConfigError, InputError
from tfshards.listing.listing import list_files
from tfshards.project.sample import SyntheticSpec, render_synthetic, write_synthetic
from tfshards.reading import loader
from tfshards.validation.validate import ValidateConfig, validate
from tfshards.writing.manifest import Manifest
from tfshards.writing.resize import JPEG_QUALITY, Resize, resize_image
from tfshards.writing.writer import WriteConfig, write


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


@pytest.fixture(scope="module")
def raw_tree(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("resize") / "raw"
    write_synthetic(str(root), 24, 64, classes=3, workers=1)
    return str(root)


def _write(raw: str, out: Path, **options: object) -> Manifest:
    config = WriteConfig(out=str(out), num_shards=4, **options)  # type: ignore[arg-type]
    return write(config, list_files(raw), progress=False).manifest


def _shard_bytes(m: Manifest) -> list[bytes]:
    return [Path(m.shard_url(s)).read_bytes() for s in m.shards]


@pytest.mark.parametrize("fmt", ["jpeg", "raw"])
def test_resized_sets_are_byte_identical_with_1_2_and_8_workers(raw_tree, tmp_path, fmt):
    runs = [
        _write(
            raw_tree, tmp_path / f"{n}-{ex}", resize=16, resize_format=fmt, workers=n, executor=ex
        )
        for n, ex in ((1, "serial"), (2, "process"), (8, "thread"))
    ]
    first = runs[0]
    for other in runs[1:]:
        assert other.fingerprint == first.fingerprint
        assert _shard_bytes(other) == _shard_bytes(first)
        assert other.to_json().replace(other.root.encode(), first.root.encode()) == first.to_json()


def test_resize_is_recorded_in_the_manifest_and_names_a_new_version(raw_tree, tmp_path):
    plain = _write(raw_tree, tmp_path / "plain")
    jpeg = _write(raw_tree, tmp_path / "jpeg", resize=16)
    raw = _write(raw_tree, tmp_path / "raw", resize=16, resize_format="raw")
    assert "resize" not in plain.params
    assert len({plain.fingerprint, jpeg.fingerprint, raw.fingerprint}) == 3
    doc = json.loads(Path(jpeg.root, "manifest.json").read_bytes())
    assert doc["params"]["resize"]["size"] == 16 and doc["params"]["resize"]["format"] == "jpeg"
    assert doc["params"]["resize"]["encoder"].startswith("pillow ")
    assert Resize.from_params(raw.params) == Resize(16, "raw")
    assert Resize.from_params(plain.params) is None


def test_resized_records_hold_the_resized_image_and_its_sha256_and_validate(raw_tree, tmp_path):
    import tensorflow as tf

    m = _write(raw_tree, tmp_path / "out", resize=16, resize_format="raw")
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


def test_a_file_that_does_not_decode_is_skipped_with_its_reason(raw_tree, tmp_path):
    import shutil

    raw = tmp_path / "raw"
    shutil.copytree(raw_tree, raw)
    (raw / "00" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0" + bytes(200))
    m = _write(str(raw), tmp_path / "out", resize=16, on_error="skip")
    assert [r.path for r in m.rejected] == ["00/broken.jpg"]
    assert "cannot decode as an image to resize" in m.rejected[0].reason
    assert m.records == 24


# ----------------------------------------------------------------------------- loader


@pytest.mark.parametrize("fmt", ["jpeg", "raw"])
def test_loader_decodes_a_set_at_its_stored_size_without_resizing(raw_tree, tmp_path, fmt):
    import tensorflow as tf

    m = _write(raw_tree, tmp_path / "out", resize=16, resize_format=fmt)
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


def test_loader_trusts_the_stored_size_and_never_resizes_at_it(raw_tree, tmp_path):
    import dataclasses

    import tensorflow as tf

    m = _write(raw_tree, tmp_path / "out", resize=20, resize_format="raw")
    params = {**m.params, "resize": {**m.params["resize"], "size": 16}}  # says 16, holds 20
    told = dataclasses.replace(m, params=params)
    data = loader.make_dataset(told.shards, told, batch_size=8, training=False, image_size=(16, 16))
    with pytest.raises(tf.errors.InvalidArgumentError, match="20,20,3"):
        next(iter(data))  # a loader that resized would hand out 16 x 16 images


def test_loader_resizes_a_set_read_at_another_size(raw_tree, tmp_path):
    m = _write(raw_tree, tmp_path / "out", resize=16, resize_format="raw")
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
