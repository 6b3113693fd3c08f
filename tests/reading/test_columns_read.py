"""make_dataset yields an index file's extra columns: fixed ones dense, variable ones ragged."""

from __future__ import annotations

import json

import pytest

from tfshards.format.columns import parse_columns
from tfshards.listing.listing import list_files
from tfshards.project.sample import write_synthetic
from tfshards.reading import loader
from tfshards.shardset.manifest import Manifest
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

tf = pytest.importorskip("tensorflow")
COLUMNS = parse_columns({"tags": "int[]", "box": "float[4]", "age": "float"})


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory: pytest.TempPathFactory) -> tuple[Manifest, dict[int, dict]]:
    """10 PNGs of 8 px in 2 shards; values by age (unique per record)."""
    base = tmp_path_factory.mktemp("columns")
    write_synthetic(str(base / "raw"), 10, 8, fmt="png", classes=2, seed=1, workers=1)
    paths = sorted(p.relative_to(base / "raw").as_posix() for p in (base / "raw").rglob("*.png"))
    rows = [
        {"path": p, "label": p[:2], "tags": list(range(i % 3)), "box": [0, 0, i / 10, 1], "age": i}
        for i, p in enumerate(paths)
    ]
    (base / "i.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    listing = list_files(str(base / "raw"), index=str(base / "i.jsonl"), columns=COLUMNS)
    config = WriteConfig(out=str(base / "out"), num_shards=2, workers=1, executor="serial")
    return write(config, listing, progress=False).manifest, {r["age"]: r for r in rows}


@pytest.mark.parametrize("per_record", [True, False])
def test_columns_come_as_dense_and_ragged_batches_beside_the_image(
    shard_set: tuple[Manifest, dict[int, dict]], per_record: bool
) -> None:
    manifest, rows = shard_set
    ds = loader.make_dataset(
        manifest.shards,
        manifest,
        batch_size=4,
        training=False,
        per_record=per_record,
        features=["image", "tags", "box", "age"],
    )
    seen = 0
    for inputs, label in ds:
        assert inputs["image"].shape[1:] == (8, 8, 3)
        assert inputs["box"].shape[1:] == (4,) and inputs["box"].dtype == tf.float32
        assert inputs["age"].shape == label.shape
        assert isinstance(inputs["tags"], tf.RaggedTensor)
        for age, tags, box in zip(
            inputs["age"].numpy(), inputs["tags"].to_list(), inputs["box"].numpy(), strict=True
        ):
            row = rows[int(age)]
            assert tags == row["tags"]
            assert box.tolist() == pytest.approx(row["box"])
            seen += 1
    assert seen == len(rows)


def test_both_decode_paths_give_the_same_elements(
    shard_set: tuple[Manifest, dict[int, dict]],
) -> None:
    """Ragged columns carry int64 row splits either way: sets read by different paths mix."""
    manifest, _ = shard_set
    kw = {"batch_size": 4, "training": False, "features": ["image", "tags", "box", "age"]}
    by_batch = loader.make_dataset(manifest.shards, manifest, per_record=False, **kw)
    by_record = loader.make_dataset(manifest.shards, manifest, per_record=True, **kw)
    assert by_batch.element_spec == by_record.element_spec
    assert by_batch.element_spec[0]["tags"].row_splits_dtype == tf.int64
    both = by_batch.concatenate(by_record)
    assert len([b for b in both]) == 2 * len([b for b in by_record])


def test_the_default_elements_stay_image_and_label(
    shard_set: tuple[Manifest, dict[int, dict]],
) -> None:
    manifest, _ = shard_set
    ds = loader.make_dataset(manifest.shards, manifest, batch_size=4, training=True, seed=1)
    images, labels = next(iter(ds))
    assert images.shape == (4, 8, 8, 3) and labels.shape == (4,)
