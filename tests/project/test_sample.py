"""Sample trees: bundled digits and deterministic synthetic images."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import fsspec
import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from tfshards.cli import app
from tfshards.errors import ConfigError
from tfshards.listing.listing import list_files
from tfshards.project.sample import SyntheticSpec, render_synthetic, write_digits, write_synthetic


def _tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("digits")
    assert write_digits(str(out)) == 1797
    return out


def test_digits_are_1797_pngs_in_10_labels(digits: Path) -> None:
    listing = list_files(str(digits))
    assert len(listing.entries) == 1797
    assert listing.labels == tuple(str(d) for d in range(10))
    assert listing.entries[0].path == "0/00000.png"
    assert sum(listing.skipped.values()) == 0
    image = Image.open(digits / "0" / "00000.png")
    assert (image.mode, image.size) == ("L", (8, 8))
    levels = {round(v * 255 / 16) for v in range(17)}  # 0..16 scaled to the full byte range
    assert set(np.unique(np.asarray(image)).tolist()) <= levels


def test_digits_are_byte_identical_on_every_run(digits: Path, tmp_path: Path) -> None:
    write_digits(str(tmp_path))
    assert _tree_digest(tmp_path) == _tree_digest(digits)


def test_synthetic_is_byte_identical_for_any_worker_count(tmp_path: Path) -> None:
    # several batches per worker, so two workers really split the work
    write_synthetic(str(tmp_path / "one"), 600, 16, workers=1)
    write_synthetic(str(tmp_path / "two"), 600, 16, workers=2)
    one = _tree_digest(tmp_path / "one")
    assert len(one) == 600
    assert one == _tree_digest(tmp_path / "two")


def test_synthetic_layout_is_class_folders_of_zero_padded_indices(tmp_path: Path) -> None:
    assert write_synthetic(str(tmp_path), 25, 12, classes=3, workers=1) == 25
    listing = list_files(str(tmp_path))
    assert listing.labels == ("00", "01", "02")
    assert listing.files_per_label() == {"00": 9, "01": 8, "02": 8}
    assert [e.path for e in listing.entries[:3]] == [
        "00/000000.jpg",
        "00/000003.jpg",
        "00/000006.jpg",
    ]


def test_seed_changes_the_images(tmp_path: Path) -> None:
    spec = SyntheticSpec(count=1, size=32)
    other = SyntheticSpec(count=1, size=32, seed=1)
    assert render_synthetic(spec, 0) == render_synthetic(spec, 0)
    assert render_synthetic(spec, 0) != render_synthetic(other, 0)


def test_png_format_and_memory_storage() -> None:
    write_synthetic("memory://syn", 4, 10, fmt="png", classes=2)
    fs = fsspec.filesystem("memory")
    data = fs.cat_file("/syn/01/000001.png")
    image = Image.open(io.BytesIO(data))
    assert (image.format, image.mode, image.size) == ("PNG", "RGB", (10, 10))


def test_class_hue_separates_classes() -> None:
    spec = SyntheticSpec(count=40, size=32, classes=4)

    def mean_rgb(index: int) -> list[float]:
        img = np.asarray(Image.open(io.BytesIO(render_synthetic(spec, index))), dtype=float)
        return [float(v) for v in img.reshape(-1, 3).mean(axis=0)]

    red = np.mean([mean_rgb(i) for i in range(0, 40, 4)], axis=0)  # class 0: hue 0
    cyan = np.mean([mean_rgb(i) for i in range(2, 40, 4)], axis=0)  # class 2: hue 0.5
    assert red[0] > red[2] + 30 and cyan[2] > cyan[0] + 30


def test_jpeg_sizes_are_realistic() -> None:
    small = SyntheticSpec(count=40, size=96)
    mean_small = np.mean([len(render_synthetic(small, i)) for i in range(40)])
    assert 3_000 < mean_small < 5_000  # ~4 KB, like small photo datasets
    large = SyntheticSpec(count=5, size=512)
    mean_large = np.mean([len(render_synthetic(large, i)) for i in range(5)])
    assert 55_000 < mean_large < 90_000  # ~70 KB


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"count": 0}, "count must be >= 1, got 0"),
        ({"size": 4}, "size must be >= 8 pixels, got 4"),
        ({"fmt": "gif"}, "format must be one of \\['jpeg', 'png'\\], got 'gif'"),
        ({"classes": 0}, "classes must be in 1..1000, got 0"),
        ({"seed": -1}, "seed must be >= 0, got -1"),
        ({"workers": 0}, "workers must be >= 1, got 0"),
    ],
)
def test_bad_synthetic_arguments_are_config_errors(
    tmp_path: Path, kwargs: dict[str, int | str], message: str
) -> None:
    args: dict[str, object] = {"count": 2, "size": 8, **kwargs}
    count, size = args.pop("count"), args.pop("size")
    with pytest.raises(ConfigError, match=message):
        write_synthetic(str(tmp_path), count, size, **args)  # type: ignore[arg-type]


def test_cli_sample_synthetic_prints_a_summary(tmp_path: Path) -> None:
    args = ["sample", "synthetic", str(tmp_path), "--count", "12", "--size", "16", "--workers", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"wrote 12 synthetic 16x16 jpeg images in 10 classes -> {tmp_path}\n"
    bad = CliRunner().invoke(app, ["sample", "synthetic", str(tmp_path), "--format", "gif"])
    assert bad.exit_code == 1
    assert bad.stderr == "error: format must be one of ['jpeg', 'png'], got 'gif'\n"


def test_cli_sample_digits_prints_a_summary(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["sample", "digits", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"wrote 1797 digit images in 10 labels -> {tmp_path}\n"


@pytest.mark.slow
def test_4k_small_jpegs_in_parallel(tmp_path: Path) -> None:
    # Many batches per worker (the bench's 20,000 cost 69 s of a test run; 4,000 shows the same).
    assert write_synthetic(str(tmp_path), 4_000, 96, workers=2) == 4_000
    assert len(list_files(str(tmp_path)).entries) == 4_000
