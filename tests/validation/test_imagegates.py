"""Gates over the image statistics the writer stored: one line per failed rule, quiet otherwise."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from tfshards.cli import app
from tfshards.errors import ConfigError
from tfshards.listing.listing import list_files
from tfshards.shardset.manifest import Manifest
from tfshards.validation.config import ValidateConfig
from tfshards.validation.imagelimits import ImageGates, parse_formats
from tfshards.validation.validate import validate
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write


def _images(root: Path, count: int, *, fmt: str = "png", width: int = 40, grey: int = 0,
            prefix: str = "f", seed: int = 0) -> None:  # fmt: skip
    """``count`` images of about ``width`` px, the first ``grey`` of them grey."""
    rng = random.Random(seed)
    for i in range(count):
        folder = root / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        mode = "L" if i < grey else "RGB"
        size = (width + rng.randint(-2, 2), 20)
        noise = rng.randbytes(size[0] * size[1] * len(mode))  # no two alike
        Image.frombytes(mode, size, noise).save(folder / f"{prefix}{i:04d}.{fmt}")


def _write(raw: Path, tmp_path: Path) -> Manifest:
    config = WriteConfig(
        out=str(tmp_path / "shards"),
        manifest_copy=str(tmp_path / "manifest.json"),
        executor="serial",
        num_shards=4,
    )
    return write(config, list_files(str(raw)), progress=False).manifest


def _manifest(tmp_path: Path) -> str:
    return str(tmp_path / "manifest.json")


def test_non_rgb_share_fails_with_one_line_naming_examples(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    _images(raw, 100, grey=5)
    _write(raw, tmp_path)
    metrics, plots = tmp_path / "images.json", tmp_path / "plots"
    args = ["validate", _manifest(tmp_path), "--workers", "1", "--val-fraction", "0.25"]
    args += ["--metrics", str(tmp_path / "metrics.json")]  # never the repository's
    args += ["--image-metrics", str(metrics), "--image-plots", str(plots)]
    quiet = CliRunner().invoke(app, args)
    assert quiet.exit_code == 0, quiet.output
    assert "image" not in quiet.stderr
    result = CliRunner().invoke(app, [*args, "--max-non-rgb-share", "0.01"])
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if "channels" in line]
    assert len(lines) == 1, result.stderr
    named = [f"c{i % 2}/f{i:04d}.png" for i in range(5)]
    assert lines[0].startswith("imagestats.json: images with other than 3 channels: ")
    assert "above max_non_rgb_share 0.01; e.g. " in lines[0]
    shown = lines[0].split("e.g. ")[1].split(", ")
    assert 1 <= len(shown) <= 3 and set(shown) <= set(named)
    doc = json.loads(metrics.read_text())
    assert next(iter(doc["train"])) == "non_rgb_share"  # what `dvc exp show` lists first
    images = {side: sum(doc[side]["formats"].values()) for side in ("train", "val")}
    assert images["train"] + images["val"] == 100 and set(doc["train"]["formats"]) == {"PNG"}
    grey = doc["train"]["non_rgb_share"] * images["train"]
    assert round(grey + doc["val"]["non_rgb_share"] * images["val"]) == 5
    assert doc["train"]["exif_rotated"] == doc["val"]["exif_rotated"] == 0
    assert 38 <= doc["train"]["median_width"] <= 42 and doc["train"]["median_height"] == 20
    rows = json.loads((plots / "train.json").read_text())
    assert sum(r["images"] for r in rows) == images["train"]


def _check(tmp_path: Path, **gates: object) -> list[str]:
    config = ValidateConfig(
        _manifest(tmp_path), workers=1, executor="serial", image_gates=ImageGates(**gates)
    )
    return [str(p) for p in validate(config).problems]


@pytest.mark.parametrize("drift", [False, True])
def test_previous_version_gates_fire_on_drift_only(tmp_path: Path, drift: bool) -> None:
    raw = tmp_path / "raw"
    _images(raw, 60, width=40)
    first = _write(raw, tmp_path)
    if drift:  # wider JPEGs join: a new format, the median width moves by half
        _images(raw, 90, fmt="jpg", width=60, prefix="new", seed=1)
    else:
        _images(raw, 90, width=40, prefix="new", seed=1)
    second = _write(raw, tmp_path)
    assert second.base == first.fingerprint
    found = _check(tmp_path, fail_on_new_format=True, max_median_width_change=10.0)
    if not drift:
        assert found == []
        return
    assert len(found) == 2, found
    new, moved = found
    assert new.startswith(f"imagestats.json: image formats new since version {first.fingerprint}")
    assert "JPEG on train" in new and re.search(r"e\.g\. c[01]/new\d{4}\.jpg", new)
    assert "median width moved" in moved and "more than max_median_width_change 10%" in moved
    assert "40 -> " in moved
    shown = moved.split("e.g. ")[1].split(", ")
    assert shown and all(p.endswith(".jpg") for p in shown)  # the new widths, not the old


def test_allowed_formats(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    _images(raw, 8)
    _images(raw, 4, fmt="jpg", prefix="j")
    _write(raw, tmp_path)
    assert _check(tmp_path, allowed_formats=("JPEG", "PNG")) == []
    (line,) = _check(tmp_path, allowed_formats=("JPEG",))
    head = "imagestats.json: image formats not in allowed_formats JPEG: PNG on train; e.g. "
    assert line.startswith(head)
    shown = line[len(head) :].split(", ")
    assert len(shown) == 3 and all(re.fullmatch(r"c[01]/f000[0-7]\.png", p) for p in shown)


def test_gate_options_are_checked() -> None:
    assert parse_formats("any") == () and parse_formats("jpg, PNG") == ("JPEG", "PNG")
    with pytest.raises(ValueError, match="unknown image formats"):
        parse_formats("tiff")
    with pytest.raises(ConfigError, match="max_non_rgb_share"):
        ImageGates(max_non_rgb_share=1.5)


def test_gif_and_webp_records_get_a_line_on_tfds(tmp_path: Path) -> None:
    """tfds decodes with tf.image.decode_image, which gives a GIF or a WebP as frames (4-D):
    builder_from_directory stops on the first. Validate says so; PNG and JPEG alone: quiet."""
    raw = tmp_path / "raw"
    _images(raw, 6)
    _write(raw, tmp_path)
    report = validate(ValidateConfig(_manifest(tmp_path), workers=1))
    assert not any(line.startswith("tfds:") for line in report.warnings)
    _images(raw, 2, fmt="gif", prefix="g")
    _images(raw, 1, fmt="webp", prefix="w")
    _write(raw, tmp_path)
    report = validate(ValidateConfig(_manifest(tmp_path), workers=1))
    (line,) = [w for w in report.warnings if w.startswith("tfds:")]
    assert line.startswith("tfds: 3 records are GIF or WebP (one is c")
    assert "builder_from_directory" in line
