"""validate checks an index file's extra columns: a value out of bounds is one problem line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tfshards.format import native
from tfshards.format.columns import parse_columns
from tfshards.format.example import encode
from tfshards.format.schema import FeatureSpec
from tfshards.format.tfrecord import frame
from tfshards.listing.listing import list_files
from tfshards.shardset.manifest import Manifest
from tfshards.validation import recordcheck
from tfshards.validation.validate import ValidateConfig, validate

COLUMNS = parse_columns({"tags": "int[]", "box": {"type": "float[4]", "min": 0, "max": 1}})


def _write(raw: Path, tmp_path: Path, write_set: Callable[..., Manifest], bad: int) -> Manifest:
    paths = sorted(p.relative_to(raw).as_posix() for p in raw.rglob("*.png"))
    rows = [
        {"path": p, "label": p[:2], "tags": [i % 5], "box": [0, 0, 1.5 if i == bad else 0.5, 1]}
        for i, p in enumerate(paths)
    ]
    (tmp_path / "i.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    listing = list_files(str(raw), index=str(tmp_path / "i.jsonl"), columns=COLUMNS)
    return write_set(listing, tmp_path / "out", num_shards=1, seed=0)


def test_a_box_out_of_bounds_is_one_problem_naming_shard_record_expected_found(
    shared_raw: Callable[..., Path], write_set: Callable[..., Manifest], tmp_path: Path
) -> None:
    raw = shared_raw(8, 8, fmt="png", classes=2, seed=3)
    manifest = _write(raw, tmp_path, write_set, bad=3)
    report = validate(ValidateConfig(manifest=str(Path(manifest.directory) / "manifest.json")))
    assert not report.ok
    assert len(report.problems) == 1
    line = str(report.problems[0])
    assert line.startswith(f"{manifest.shards[0].name}: record ")
    assert line.endswith("feature 'box': expected values in [0, 1], found 1.5 at index 2")


def test_values_within_bounds_pass(
    shared_raw: Callable[..., Path], write_set: Callable[..., Manifest], tmp_path: Path
) -> None:
    raw = shared_raw(8, 8, fmt="png", classes=2, seed=3)
    manifest = _write(raw, tmp_path, write_set, bad=-1)
    report = validate(ValidateConfig(manifest=str(Path(manifest.directory) / "manifest.json")))
    assert report.ok, [str(p) for p in report.problems]


@pytest.mark.parametrize("loop", ["c", "python"])
def test_a_variable_list_off_its_multiple_is_a_problem_on_either_loop(
    loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if loop == "python":
        monkeypatch.setattr(native, "NATIVE", None)
    columns = parse_columns({"boxes": {"type": "float[]", "multiple": 4, "max": 1}})
    schema = (FeatureSpec("boxes", "float", None), FeatureSpec("image", "bytes", ()))
    records = [[0.0, 0.0, 1.0, 1.0], [0.0, 0.5, 1.0], [], [0.0, 0.0, 2.0, 1.0]]
    buf = b"".join(
        b"".join(frame(encode({"image": ("bytes", [b"x"]), "boxes": ("float", v)})[0]))
        for v in records
    )
    problems: list[tuple[str, int]] = []
    checker = recordcheck.RecordChecker(
        schema,
        "image",
        num_labels=0,
        check_sha=False,
        decode_images=False,
        labels=[],
        add=lambda what, index, offset: problems.append((what, index)),
        columns=columns,
    )
    assert recordcheck.check_records(buf, checker) == 4
    assert problems == [
        ("feature 'boxes': expected a multiple of 4 values, found 3", 1),
        ("feature 'boxes': expected values in [-inf, 1], found 2 at index 2", 3),
    ]
