"""TensorFlow Datasets metadata: a fresh write opens with tfds.builder_from_directory."""

from __future__ import annotations

import hashlib
import io
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tfshards.shardset import layout
from tfshards.shardset.datasetinfo import tfds_files
from tfshards.shardset.layout import MANIFEST_NAME
from tfshards.shardset.manifest import Manifest
from tfshards.validation.validate import ValidateConfig, validate

tfds = pytest.importorskip("tensorflow_datasets")


@pytest.fixture
def raw(shared_raw: Callable[..., Path]) -> Path:
    return shared_raw(30, 12, fmt="png", classes=3, seed=2)


@pytest.fixture
def write_options() -> dict[str, object]:
    return {"name": "synth", "num_shards": 3, "seed": 4}


def test_builder_from_directory_reads_decoded_images_with_label_names_and_counts(
    write_set: Callable[..., Manifest], raw: Path, tmp_path: Path
) -> None:
    manifest = write_set(raw, tmp_path / "out")
    builder = tfds.builder_from_directory(manifest.root)
    split = builder.info.splits["train"]
    assert list(builder.info.splits) == ["train"]
    assert builder.info.features["label"].names == ["00", "01", "02"] == list(manifest.labels)
    assert split.shard_lengths == [s.records for s in manifest.shards]
    assert len(split.shard_lengths) == 3
    assert split.num_examples == manifest.records == 30
    assert split.num_bytes == manifest.bytes
    assert [Path(f).name for f in split.filenames] == [s.name for s in manifest.shards]
    seen = {}
    for ex in tfds.as_numpy(builder.as_dataset(split="train", shuffle_files=False)):
        path = ex["path"].decode()
        want = np.asarray(Image.open(raw / path).convert("RGB"))
        assert ex["image"].dtype == np.uint8 and ex["image"].shape == want.shape == (12, 12, 3)
        assert np.array_equal(ex["image"], want)
        assert builder.info.features["label"].int2str(ex["label"]) == path.split("/")[0]
        seen[path] = ex["sha256"].decode()
    assert len(seen) == 30
    # Split slicing counts records through the shard lengths.
    assert len(list(builder.as_dataset(split="train[:20%]"))) == 6


def test_metadata_equals_what_tfds_writes_for_the_same_features_and_split(
    write_set: Callable[..., Manifest], raw: Path, tmp_path: Path
) -> None:
    manifest = write_set(raw, tmp_path / "out")
    from tensorflow_datasets.core import dataset_info, file_adapters, naming, utils
    from tensorflow_datasets.core import splits as split_lib

    features = tfds.features.FeaturesDict(
        {
            "image": tfds.features.Image(shape=(None, None, 3)),
            "label": tfds.features.ClassLabel(names=list(manifest.labels)),
            "path": tfds.features.Text(),
            "sha256": tfds.features.Text(),
        }
    )
    ours = tfds_files(manifest)
    theirs = tmp_path / "tfds"
    theirs.mkdir()
    info = dataset_info.DatasetInfo(
        builder=dataset_info.DatasetIdentity(
            name="synth", version=utils.Version("1.0.0"), data_dir=str(theirs), module_name=""
        ),
        features=features,
        description=json.loads(ours["dataset_info.json"])["description"],
    )
    info.set_file_format(file_adapters.FileFormat.TFRECORD)
    template = naming.ShardedFileTemplate(
        data_dir=theirs,
        template="synth-{SHARD_X_OF_Y}.tfrecord",
        dataset_name="synth",
        split="train",
        filetype_suffix="tfrecord",
    )
    info.set_splits(
        split_lib.SplitDict(
            [
                split_lib.SplitInfo(
                    name="train",
                    shard_lengths=[s.records for s in manifest.shards],
                    num_bytes=manifest.bytes,
                    filename_template=template,
                )
            ]
        )
    )
    info.write_to_directory(theirs)
    assert sorted(p.name for p in theirs.iterdir()) == sorted(ours) == sorted(layout.TFDS_FILES)
    for name, data in ours.items():
        if name.endswith(".json"):
            assert json.loads(data) == json.loads((theirs / name).read_bytes()), name
        else:
            assert data == (theirs / name).read_bytes(), name
        assert (Path(manifest.root) / name).read_bytes() == data
        assert manifest.metadata_files[name] == hashlib.sha256(data).hexdigest()


TRANSFORM = """
import io
from PIL import Image

def size_and_mean(path, data, label):
    image = Image.open(io.BytesIO(data))
    return {"size": list(image.size), "mean": float(sum(image.convert("L").getdata())) / 144}
"""


def test_transform_features_are_tensors_and_a_transformed_payload_is_bytes(
    write_set: Callable[..., Manifest], raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tx_tfds.py").write_text(TRANSFORM)
    monkeypatch.chdir(tmp_path)
    sys.modules.pop("tx_tfds", None)
    manifest = write_set(raw, tmp_path / "out", transform="tx_tfds:size_and_mean")
    features = json.loads(tfds_files(manifest)["features.json"])["featuresDict"]["features"]
    assert features["image"]["tensor"]["dtype"] == "string"
    builder = tfds.builder_from_directory(manifest.root)
    ex = next(iter(tfds.as_numpy(builder.as_dataset(split="train", shuffle_files=False))))
    assert Image.open(io.BytesIO(ex["image"])).size == (12, 12)
    assert ex["size"].tolist() == [12, 12] and ex["mean"].dtype == np.float32
    assert features["size"]["tensor"]["shape"] == {"dimensions": ["2"]}


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
def test_a_compressed_set_gets_no_tfds_metadata(
    write_set: Callable[..., Manifest], raw: Path, tmp_path: Path, compression: str
) -> None:
    manifest = write_set(raw, tmp_path / "out", compression=compression)
    assert not any((Path(manifest.root) / name).exists() for name in layout.TFDS_FILES)
    assert manifest.metadata_files == {}
    assert b"metadata_files" not in (Path(manifest.root) / MANIFEST_NAME).read_bytes()


def test_validate_reports_changed_and_missing_metadata(
    write_set: Callable[..., Manifest], raw: Path, tmp_path: Path
) -> None:
    manifest = write_set(raw, tmp_path / "out")
    url = f"{manifest.root}/{MANIFEST_NAME}"
    version = Path(manifest.root)
    (version / "label.labels.txt").write_text("cat\ndog\nbird\n")
    (version / "features.json").unlink()
    report = validate(ValidateConfig(url))
    assert sorted(str(p) for p in report.problems) == [
        "features.json: missing: expected a file the manifest lists",
        "label.labels.txt: sha256 mismatch: expected "
        f"{manifest.metadata_files['label.labels.txt']}, found "
        + hashlib.sha256(b"cat\ndog\nbird\n").hexdigest(),
    ]


def test_index_columns_are_tensors_tfds_reads_with_no_user_code(
    write_set: Callable[..., Manifest], raw: Path, tmp_path: Path
) -> None:
    from tfshards.format.columns import parse_columns
    from tfshards.listing.listing import list_files

    paths = sorted(p.relative_to(raw).as_posix() for p in raw.rglob("*.png"))
    rows = [{"path": p, "label": p[:2], "tags": [i % 4] * (i % 3), "box": [0, 0, 1, i / 30]}
            for i, p in enumerate(paths)]  # fmt: skip
    (tmp_path / "i.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    columns = parse_columns({"tags": "int[]", "box": "float[4]"})
    listing = list_files(str(raw), index=str(tmp_path / "i.jsonl"), columns=columns)
    manifest = write_set(listing, tmp_path / "out")
    features = json.loads(tfds_files(manifest)["features.json"])["featuresDict"]["features"]
    assert features["box"]["tensor"] == {
        "dtype": "float32", "encoding": "none", "shape": {"dimensions": ["4"]}
    }  # fmt: skip
    assert features["tags"]["tensor"]["shape"] == {"dimensions": ["-1"]}
    builder = tfds.builder_from_directory(manifest.root)
    want = {r["path"]: r for r in rows}
    for ex in tfds.as_numpy(builder.as_dataset(split="train", shuffle_files=False)):
        row = want.pop(ex["path"].decode())
        assert ex["tags"].tolist() == row["tags"]
        assert ex["box"].tolist() == pytest.approx(row["box"])
    assert want == {}
