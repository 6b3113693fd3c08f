"""User transforms through `tfshards write`: values are stored exactly or refused, never bent."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tfshards.cli import app
from tfshards.errors import TransformError
from tfshards.format.exampleparser import decode
from tfshards.format.schema import normalize
from tfshards.format.tfrecord import scan
from tfshards.listing.listing import list_files, write_listing
from tfshards.project.sample import write_synthetic
from tfshards.shardset.manifest import Manifest

SKIP = "; write.on_error: skip leaves such files out"  # the hint a skippable file gets
TRANSFORMS = """
import numpy as np

def huge_int(path, data, label):
    return {"id": 2**64 + 5}

def huge_uint64(path, data, label):
    return {"id": np.uint64(2**64 - 1)}

def huge_uint64_array(path, data, label):
    return {"ids": np.array([1, 2**64 - 1], dtype=np.uint64)}

def huge_float(path, data, label):
    return {"score": 1e300}

def huge_float_list(path, data, label):
    return {"scores": [0.5, -1e39]}

def huge_float_array(path, data, label):
    return {"grid": np.array([[0.0, 1.0], [np.inf, 3.5e38]])}

def nested(path, data, label):
    return {"grid": [[1, 2], [3, 4], [5, 6]]}

def ragged(path, data, label):
    return {"grid": [[1, 2], [3]]}

def surrogate(path, data, label):
    return {"caption": "caf\\udce9"}

def some_files_extra(path, data, label):  # every third file gets one more feature
    return {"a": 1, "b": 2} if path.endswith(("3.jpg", "6.jpg", "9.jpg")) else {"a": 1}

def some_files_missing(path, data, label):
    return {} if path.endswith("4.jpg") else {"a": 1}
"""


@pytest.fixture
def listing_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    raw = tmp_path / "raw"
    write_synthetic(str(raw), 12, 16, classes=2, workers=1)
    write_listing(list_files(str(raw)), str(tmp_path / "listing"))
    (tmp_path / "tx_hostile.py").write_text(TRANSFORMS)
    monkeypatch.chdir(tmp_path)
    sys.modules.pop("tx_hostile", None)
    return tmp_path / "listing"


def _write(listing_dir: Path, transform: str, *more: str) -> tuple[int, str, str]:
    out = listing_dir.parent
    result = CliRunner().invoke(
        app,
        [
            *("write", str(listing_dir), "--out", str(out / "shards")),
            *("--manifest", str(out / "m.json"), "--no-progress", "--workers", "1"),
            *("--transform", transform, *more),
        ],
    )
    return result.exit_code, result.stdout, result.stderr


def _one_line_error(code: int, stderr: str) -> str:
    assert code == 1, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


INT64 = "expected an int64 (-9223372036854775808..9223372036854775807)"


@pytest.mark.parametrize(
    ("transform", "found"),
    [
        ("huge_int", f"feature 'id': {INT64}, found 18446744073709551621"),
        ("huge_uint64", f"feature 'id': {INT64}, found 18446744073709551615"),
        ("huge_uint64_array", f"feature 'ids': {INT64}, found 18446744073709551615"),
    ],
)
def test_an_int_outside_int64_is_refused_naming_file_and_feature(listing_dir, transform, found):
    code, _, stderr = _write(listing_dir, f"tx_hostile:{transform}")
    line = _one_line_error(code, stderr)
    assert line.startswith(f"error: {listing_dir.parent / 'raw'}/0") and ".jpg: " in line
    # Every file fails the same way: one line names the first and counts the others.
    assert f"{found}; 11 more files failed too: " in line and line.endswith(SKIP)
    assert not (listing_dir.parent / "m.json").exists()


def test_nested_rectangular_lists_are_flattened_with_their_shape(listing_dir):
    code, _, stderr = _write(listing_dir, "tx_hostile:nested")
    assert code == 0, stderr
    manifest = Manifest.from_json((listing_dir.parent / "m.json").read_bytes())
    assert {s.name: s.shape for s in manifest.schema}["grid"] == (3, 2)
    shard = Path(manifest.shard_url(manifest.shards[0])).read_bytes()
    _, _, data, _ = next(iter(scan(shard)))
    assert decode(bytes(data))["grid"] == ("int64", [1, 2, 3, 4, 5, 6])


def test_ragged_nested_lists_are_refused_naming_file_and_feature(listing_dir):
    code, _, stderr = _write(listing_dir, "tx_hostile:ragged")
    line = _one_line_error(code, stderr)
    assert ".jpg: feature 'grid': nested lists must be rectangular: " in line
    assert "expected item 1 of shape [2] like item 0, found shape [1]; 11 more files " in line
    assert line.endswith(SKIP)


def test_a_lone_surrogate_in_a_string_is_refused_naming_file_and_feature(listing_dir):
    code, _, stderr = _write(listing_dir, "tx_hostile:surrogate")
    line = _one_line_error(code, stderr)
    assert ".jpg: feature 'caption': expected text that encodes as UTF-8, found '\\udce9'" in line


def test_a_feature_some_files_lack_is_refused_naming_file_and_key(listing_dir):
    # One shard: the first file of the shuffled order sets the features.
    code, _, stderr = _write(listing_dir, "tx_hostile:some_files_missing", "--num-shards", "1")
    line = _one_line_error(code, stderr)
    assert "4.jpg: transform tx_hostile:some_files_missing: expected the features ['a'] " in line
    assert line.endswith("returned, found 'a' missing")


def test_a_feature_only_some_files_get_is_refused_even_with_skip(listing_dir):
    code, _, stderr = _write(
        listing_dir, "tx_hostile:some_files_extra", "--num-shards", "1", "--on-error", "skip"
    )
    line = _one_line_error(code, stderr)
    assert "'b' extra" in line or "'b' missing" in line
    assert not (listing_dir.parent / "m.json").exists()


def test_features_that_differ_between_shards_are_refused_naming_a_file(listing_dir):
    # Twelve shards of one file each: no shard sees both kinds, only the writer does.
    code, _, stderr = _write(listing_dir, "tx_hostile:some_files_extra", "--num-shards", "12")
    line = _one_line_error(code, stderr)
    assert ".jpg: transform tx_hostile:some_files_extra: expected the features " in line
    assert "'b' extra" in line or "'b' missing" in line
    assert not (listing_dir.parent / "m.json").exists()


def test_a_transform_module_with_a_syntax_error_is_one_line(listing_dir):
    (listing_dir.parent / "tx_broken.py").write_text("def f(path, data, label):\n    return {\n")
    sys.modules.pop("tx_broken", None)
    code, _, stderr = _write(listing_dir, "tx_broken:f")
    line = _one_line_error(code, stderr)
    assert line.startswith("error: transform 'tx_broken:f': cannot import module 'tx_broken' ")
    assert "SyntaxError" in line and "tx_broken.py, line 2" in line


def test_a_transform_module_that_raises_on_import_is_one_line(listing_dir):
    (listing_dir.parent / "tx_raises.py").write_text("import json\nraise RuntimeError('no GPU')\n")
    sys.modules.pop("tx_raises", None)
    code, _, stderr = _write(listing_dir, "tx_raises:f")
    line = _one_line_error(code, stderr)
    assert line.endswith("cannot import module 'tx_raises' (RuntimeError: no GPU)")


F32 = "expected a float32 (magnitude below 3.4028236e+38; floats are stored as float32)"


@pytest.mark.parametrize(
    ("transform", "found"),
    [
        ("huge_float", f"feature 'score': {F32}, found 1e+300"),
        ("huge_float_list", f"feature 'scores': {F32}, found -1e+39"),
        ("huge_float_array", f"feature 'grid': {F32}, found 3.5e+38 at index 3 of shape [2, 2]"),
    ],
)
@pytest.mark.filterwarnings("error::RuntimeWarning")  # numpy's overflow warning is no answer
def test_a_float_outside_float32_is_refused_naming_file_feature_and_value(
    listing_dir, transform, found
):
    code, _, stderr = _write(listing_dir, f"tx_hostile:{transform}")
    line = _one_line_error(code, stderr)
    assert line.startswith(f"error: {listing_dir.parent / 'raw'}/0") and ".jpg: " in line
    # Every file fails the same way: one line names the first and counts the others.
    assert f"{found}; 11 more files failed too: " in line and line.endswith(SKIP)
    assert not (listing_dir.parent / "m.json").exists()


def test_floats_up_to_float32s_rounding_edge_are_kept_and_inf_and_nan_pass():
    largest = float(np.finfo(np.float32).max)
    below_edge = np.nextafter(2.0**128 - 2.0**103, 0.0)  # still rounds to the largest float32
    _, values, _ = normalize("f", [largest, float(below_edge), float("inf"), float("nan")])
    stored = np.asarray(values, np.float32)
    assert list(stored[:3]) == [largest, largest, np.inf] and np.isnan(stored[3])
    _, array, _ = normalize("f", np.array([below_edge, -np.inf]))
    assert list(array) == [largest, -np.inf]
    for edge in (2.0**128 - 2.0**103, np.array([0.0, -(2.0**128)])):
        with pytest.raises(TransformError, match=r"feature 'f': expected a float32"):
            normalize("f", edge)


@pytest.mark.parametrize(
    ("value", "shape", "flat"),
    [
        ([1, 2, 3], (3,), [1, 2, 3]),
        ([[1.5], [2.5]], (2, 1), [1.5, 2.5]),
        ([np.arange(2), np.arange(2)], (2, 2), [0, 1, 0, 1]),
        (np.array([[1, 2], [3, 4]], dtype=np.uint64), (2, 2), [1, 2, 3, 4]),
        (-(2**63), (), [-(2**63)]),
    ],
)
def test_normalize_keeps_every_value_and_the_shape(value, shape, flat):
    _, values, got = normalize("f", value)
    assert got == shape and [v.item() if hasattr(v, "item") else v for v in values] == flat


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, [[1], [[2]]], [[1, 2], 3]])
def test_normalize_refuses_what_it_cannot_store_exactly(value):
    with pytest.raises(TransformError, match="feature 'f': "):
        normalize("f", value)
