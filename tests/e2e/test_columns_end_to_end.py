"""An index file with a multi-hot column and a box column, through the command line:
list, write, validate (a box out of bounds fails in one line), then make_dataset and tfds."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfshards.project.sample import write_synthetic
from tfshards.reading import loader
from tfshards.shardset.manifest import load

tf = pytest.importorskip("tensorflow")
tfds = pytest.importorskip("tensorflow_datasets")
COLUMNS = '{"tags": "int[]", "box": {"type": "float[4]", "min": 0, "max": 1}}'


def _cli(*args: str) -> tuple[int, str]:
    from tfshards.cli import app

    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout + result.stderr


def _pipeline(raw: Path, work: Path, bad_box: bool) -> tuple[int, str, Path]:
    """list -> write -> validate of ``raw`` with a CSV index; validate's code and output."""
    work.mkdir()
    paths = sorted(p.relative_to(raw).as_posix() for p in raw.rglob("*.png"))
    lines = ["path,label,tags,box"]
    for i, p in enumerate(paths):
        top = 1.25 if bad_box and i == 4 else 1
        lines.append(f'{p},{p[:2]},{" ".join(map(str, range(i % 3)))},"[0, 0.25, {top}, 1]"')
    (work / "index.csv").write_text("\n".join(lines) + "\n")
    code, out = _cli(
        "list", str(raw), "--out", str(work / "listing"), "--index", str(work / "index.csv"),
        "--columns", COLUMNS, "--hash-cache", "none",
    )  # fmt: skip
    assert code == 0, out
    code, out = _cli(
        "write", str(work / "listing"), "--out", str(work / "shards"), "--num-shards", "2",
        "--manifest", str(work / "manifest.json"), "--no-progress",
    )  # fmt: skip
    assert code == 0, out
    manifest = work / "manifest.json"
    code, out = _cli("validate", str(manifest), "--metrics", str(work / "m.json"), "--no-progress")
    return code, out, manifest


def test_index_columns_list_write_validate_and_read(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    write_synthetic(str(raw), 12, 8, fmt="png", classes=3, seed=7, workers=1)

    code, out, _ = _pipeline(raw, tmp_path / "bad", bad_box=True)
    problems = [line for line in out.splitlines() if "feature 'box'" in line]
    assert code == 1 and len(problems) == 1, out
    assert "record " in problems[0] and ".tfrecord" in problems[0]
    assert problems[0].endswith("expected values in [0, 1], found 1.25 at index 2")

    code, out, manifest_path = _pipeline(raw, tmp_path / "good", bad_box=False)
    assert code == 0, out
    manifest = load(str(manifest_path))
    ds = loader.make_dataset(
        manifest.shards, manifest, batch_size=4, training=False, features=["image", "tags", "box"]
    )
    inputs, labels = next(iter(ds))
    assert inputs["box"].shape == (4, 4) and isinstance(inputs["tags"], tf.RaggedTensor)
    assert inputs["image"].shape == (4, 8, 8, 3) and labels.shape == (4,)
    builder = tfds.builder_from_directory(manifest.directory)
    examples = list(tfds.as_numpy(builder.as_dataset(split="train", shuffle_files=False)))
    assert len(examples) == 12
    assert {tuple(ex["box"].tolist()) for ex in examples} == {(0.0, 0.25, 1.0, 1.0)}
    assert sorted(len(ex["tags"]) for ex in examples) == [0] * 4 + [1] * 4 + [2] * 4
