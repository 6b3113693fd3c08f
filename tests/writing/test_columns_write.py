"""The writer stores an index file's extra columns as features of each record."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tfshards.errors import ConfigError, TransformOutputError
from tfshards.format.columns import parse_columns
from tfshards.format.exampleparser import decode
from tfshards.format.schema import FeatureSpec
from tfshards.format.tfrecord import scan
from tfshards.listing.listing import Listing, list_files
from tfshards.shardset.manifest import Manifest
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

COLUMNS = parse_columns(
    {"tags": "int[]", "box": {"type": "float[4]", "min": 0, "max": 1}, "age": "float"}
)


def _listing(raw: Path, tmp_path: Path) -> Listing:
    rows = []
    for i, path in enumerate(sorted(p.relative_to(raw).as_posix() for p in raw.rglob("*.png"))):
        row = {"path": path, "label": path.split("/")[0], "tags": list(range(i % 3))}
        rows.append(json.dumps({**row, "box": [0, 0, 0.5, i / 10], "age": i + 0.5}))
    (tmp_path / "index.jsonl").write_text("\n".join(rows) + "\n")
    return list_files(str(raw), index=str(tmp_path / "index.jsonl"), columns=COLUMNS)


def test_columns_become_features_of_the_schema_and_each_record(
    shared_raw: Callable[..., Path], write_set: Callable[..., Manifest], tmp_path: Path
) -> None:
    listing = _listing(shared_raw(9, 8, fmt="png", classes=3, seed=5), tmp_path)
    manifest = write_set(listing, tmp_path / "out", num_shards=2)
    schema = {spec.name: spec for spec in manifest.schema}
    assert schema["age"] == FeatureSpec("age", "float", ())
    assert schema["box"] == FeatureSpec("box", "float", (4,))
    assert schema["tags"] == FeatureSpec("tags", "int64", None)
    assert manifest.params["columns"]["box"] == {"max": 1, "min": 0, "type": "float[4]"}
    assert manifest.columns == COLUMNS
    want = {e.path: e.values for e in listing.entries}
    seen = 0
    for shard in manifest.shards:
        data = (Path(manifest.directory) / shard.name).read_bytes()
        for _, _, record, _ in scan(data):
            assert record is not None
            fields = decode(record)
            values = want[bytes(fields["path"][1][0]).decode()]
            assert values is not None
            assert fields["tags"] == ("int64", values["tags"])
            assert [float(v) for v in fields["box"][1]] == pytest.approx(values["box"])
            assert float(fields["age"][1][0]) == values["age"]
            seen += 1
    assert seen == len(want)


def test_a_set_with_columns_is_written_anew_over_a_previous_version(
    shared_raw: Callable[..., Path], tmp_path: Path
) -> None:
    listing = _listing(shared_raw(9, 8, fmt="png", classes=3, seed=5), tmp_path)
    copy = str(tmp_path / "manifest.json")
    config = WriteConfig(out=str(tmp_path / "out"), num_shards=2, manifest_copy=copy)
    write(config, listing, progress=False)
    again = write(config, listing, progress=False)  # a member list cannot vouch for the values
    assert again.unchanged is False
    assert again.fresh == "extra columns: a set with them is written anew"


def test_a_column_named_like_the_payload_is_refused(
    shared_raw: Callable[..., Path], tmp_path: Path
) -> None:
    listing = _listing(shared_raw(9, 8, fmt="png", classes=3, seed=5), tmp_path)
    config = WriteConfig(out=str(tmp_path / "out"), num_shards=2, image_feature="age")
    with pytest.raises(ConfigError, match="columns: age: expected a name other than the payload"):
        write(config, listing, progress=False)


def test_a_transform_feature_named_like_a_column_is_refused(
    shared_raw: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = "def age(path, data, label):\n    return {'age': 1.0}\n"
    (tmp_path / "tx_columns.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "tx_columns", raising=False)
    listing = _listing(shared_raw(9, 8, fmt="png", classes=3, seed=5), tmp_path)
    config = WriteConfig(out=str(tmp_path / "out"), num_shards=2, transform="tx_columns:age")
    with pytest.raises(TransformOutputError, match="expected features other than the index colu"):
        write(config, listing, progress=False)
