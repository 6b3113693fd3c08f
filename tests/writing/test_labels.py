"""A pinned label map (write.labels): ids are positions in it, whatever folders come and go."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from tfshards import storage
from tfshards.cli import app
from tfshards.errors import ConfigError, InputError
from tfshards.format import tfrecord
from tfshards.format.exampleparser import decode
from tfshards.listing.listing import list_files, write_listing
from tfshards.shardset.manifest import Manifest, load
from tfshards.validation.config import ValidateConfig
from tfshards.validation.validate import validate
from tfshards.writing import labelmap
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

TEN = ("cat", "dog", "bird", "fish", "frog", "horse", "mouse", "owl", "snake", "wolf")


def _image(n: int) -> bytes:
    """A distinct 4 x 4 PNG per ``n`` (no two records share a payload)."""
    pixels = np.random.default_rng(n).integers(0, 256, (4, 4), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "L").save(buf, "PNG")
    return buf.getvalue()


def _folders(raw: Path, names: tuple[str, ...], per_label: int = 2) -> None:
    for i, name in enumerate(names):
        (raw / name).mkdir(parents=True, exist_ok=True)
        for j in range(per_label):
            n = 1000 * sum(map(ord, name)) + 10 * i + j
            (raw / name / f"{j}.png").write_bytes(_image(n))


def _write(raw: Path, out: Path, **kw) -> Manifest:
    config = WriteConfig(out=str(out), num_shards=2, executor="serial", **kw)
    return write(config, list_files(str(raw)), progress=False).manifest


def _labels_by_path(manifest: Manifest) -> dict[str, int]:
    fs, _ = storage.open_url(manifest.directory)
    found = {}
    for shard in manifest.shards:
        for record in tfrecord.scan(fs.cat_file(manifest.shard_url(shard))):
            features = decode(record.data)
            path = bytes(features["path"][1][0]).decode()
            found[path] = int(features["label"][1][0])
    return found


def _label_file(manifest: Manifest) -> list[str]:
    return (Path(manifest.directory) / "label.labels.txt").read_text().splitlines()


def test_a_new_folder_appended_to_the_map_keeps_every_other_id(tmp_path):
    raw = tmp_path / "raw"
    _folders(raw, TEN)
    before = _labels_by_path(_write(raw, tmp_path / "a", labels=TEN))
    assert before == {f"{name}/{j}.png": TEN.index(name) for name in TEN for j in range(2)}

    _folders(raw, ("aardvark",))  # sorts first: unpinned, it would shift every id by one
    unpinned = _labels_by_path(_write(raw, tmp_path / "b"))
    assert unpinned["cat/0.png"] == sorted((*TEN, "aardvark")).index("cat")

    manifest = _write(raw, tmp_path / "c", labels=(*TEN, "aardvark"))
    after = _labels_by_path(manifest)
    assert {p: after[p] for p in before} == before
    assert after["aardvark/0.png"] == after["aardvark/1.png"] == 10
    assert manifest.labels == (*TEN, "aardvark")
    assert manifest.params["labels"] == [*TEN, "aardvark"]
    assert _label_file(manifest) == [*TEN, "aardvark"]  # the TFDS label file follows


def test_a_label_without_records_keeps_its_id_and_the_set_validates(tmp_path):
    raw = tmp_path / "raw"
    _folders(raw, TEN[1:])
    manifest = _write(raw, tmp_path / "out", labels=TEN, manifest_copy=str(tmp_path / "m.json"))
    assert manifest.labels == TEN and min(_labels_by_path(manifest).values()) == 1
    assert load(str(tmp_path / "m.json")).labels == TEN
    report = validate(ValidateConfig(manifest=str(tmp_path / "m.json"), executor="serial"))
    assert report.ok, report.summary()


def test_the_map_names_the_version(tmp_path):
    raw = tmp_path / "raw"
    _folders(raw, TEN[:3])
    names = [
        _write(raw, tmp_path / "out", **kw).fingerprint
        for kw in ({}, {"labels": ("bird", "cat", "dog")}, {"labels": ("cat", "dog", "bird")})
    ]
    assert names[0] == names[1] != names[2]  # the map is the content: the same ids, one name


def _cli(*args: str):
    return CliRunner().invoke(app, ["write", *args, "--executor", "serial", "--no-progress"])


def test_numeric_folders_pinned_in_numeric_order_get_their_numbers(tmp_path):
    raw = tmp_path / "raw"
    numbers = tuple(str(n) for n in range(26))
    _folders(raw, numbers, per_label=1)
    write_listing(list_files(str(raw)), str(tmp_path / "listing"))
    manifest = tmp_path / "manifest.json"
    result = _cli(
        str(tmp_path / "listing"), "--out", str(tmp_path / "out"), "--manifest", str(manifest),
        "--num-shards", "4", "--labels", ", ".join(numbers),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    written = load(str(manifest))
    assert written.labels == numbers  # not 0, 1, 10, 11, ...
    assert _labels_by_path(written) == {f"{n}/0.png": n for n in range(26)}
    report = validate(ValidateConfig(manifest=str(manifest), executor="serial"))
    assert report.ok, report.summary()


def test_a_listed_label_missing_from_the_map_is_one_line_and_exit_1(tmp_path):
    raw = tmp_path / "raw"
    _folders(raw, (*TEN, "aardvark"), per_label=1)
    write_listing(list_files(str(raw)), str(tmp_path / "listing"))
    out = tmp_path / "out"
    result = _cli(str(tmp_path / "listing"), "--out", str(out), "--labels", ",".join(TEN))
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: labels: "), result.stderr
    assert "'aardvark'" in lines[0] and "write.labels" in lines[0] and "append" in lines[0]
    assert not any(out.rglob("*.tfrecord")) and not any(out.rglob("manifest.json"))


def test_missing_labels_are_named_first_few_then_counted():
    with pytest.raises(ConfigError) as caught:
        labelmap.label_ids([f"x{i}" for i in range(8)] + ["cat"], ["cat"])
    message = str(caught.value)
    assert "'x0', 'x1', 'x2', 'x3', 'x4' and 3 more" in message and "\n" not in message
    assert "ids 1 and up" in message


@pytest.mark.parametrize(
    ("labels", "said"),
    [(("cat", "dog", "cat"), "expected each label once, got 'cat' again at position 2"),
     (("cat", "", "dog"), "expected non-empty label names, got '' at position 1"),
     ((), "expected a list of label names")],
)  # fmt: skip
def test_a_map_with_repeated_or_empty_names_is_a_config_error(tmp_path, labels, said):
    with pytest.raises(ConfigError, match=said) as caught:
        WriteConfig(out=str(tmp_path), labels=labels)
    assert "\n" not in str(caught.value)


def test_a_repeated_name_on_the_command_line_is_one_line(tmp_path):
    (tmp_path / "listing").mkdir()
    result = _cli(str(tmp_path / "listing"), "--out", str(tmp_path / "out"), "--labels", "a,b,a")
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "labels: expected each label once, got 'a' again" in result.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [(None, None), ("None", None), ("none", None), ("", None), ("null", None),
     ("cat", ("cat",)), ("cat, dog ,bird", ("cat", "dog", "bird")), ("a,,b", ("a", "", "b"))],
)  # fmt: skip
def test_the_command_line_form_is_comma_separated(text, expected):
    assert labelmap.parse_labels(text) == expected


def test_a_stored_listing_on_worker_processes_gets_the_pinned_ids(tmp_path):
    """The stored rows, relabelled, are pickled to processes and framed by the C path."""
    raw = tmp_path / "raw"
    _folders(raw, TEN[:4], per_label=3)
    write_listing(list_files(str(raw)), str(tmp_path / "listing"))
    pinned = ("wolf", "frog", "fish", "dog", "cat", "bird")
    config = WriteConfig(out=str(tmp_path / "out"), num_shards=2, labels=pinned, workers=2,
                         executor="process")  # fmt: skip
    manifest = write(config, str(tmp_path / "listing"), progress=False).manifest
    found = _labels_by_path(manifest)
    assert found == {f"{n}/{j}.png": pinned.index(n) for n in TEN[:4] for j in range(3)}
    assert json.loads(manifest.to_json())["labels"] == list(pinned)


def test_a_manifest_whose_labels_are_not_its_pinned_map_is_refused(tmp_path):
    raw = tmp_path / "raw"
    _folders(raw, TEN[:3], per_label=1)
    doc = json.loads(_write(raw, tmp_path / "out", labels=TEN[:3]).to_json())
    assert Manifest.from_json(json.dumps(doc)).labels == TEN[:3]  # unsorted, as pinned
    doc["labels"] = sorted(TEN[:3])
    with pytest.raises(InputError, match=r"labels: expected the unique names of params\.labels"):
        Manifest.from_json(json.dumps(doc))


@pytest.mark.parametrize("name", ["x\ny", " sp", "tail ", "cr\r", "ls\u2028x"])
def test_a_label_that_label_labels_txt_cannot_hold_is_refused(name):
    """One name a line, read back stripped by tfds: it would come back another name."""
    with pytest.raises(InputError, match=r"expected a name without line breaks"):
        labelmap.resolve(["a", name], None, None, False)
