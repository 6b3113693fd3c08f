"""An index file's extra columns: kept per entry, stored as ``values``, read back, checked."""

from __future__ import annotations

import json
from array import array
from pathlib import Path

import pytest

from tfshards.errors import ConfigError, InputError
from tfshards.format.columns import parse_columns
from tfshards.listing.listing import list_files, read_listing, write_listing
from tfshards.listing.storedlisting import open_stored

COLUMNS = parse_columns({"tags": "int[]", "box": {"type": "float[4]", "min": 0, "max": 1}})


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for rel in ("a/1.png", "a/2.png", "b/3.png"):
        (tmp_path / "raw" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "raw" / rel).write_bytes(rel.encode())
    return tmp_path / "raw"


def _index(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


CSV = 'path,label,tags,box,note\na/1.png,cat,1 3,"[0, 0, 0.5, 0.5]",x\nb/3.png,dog,,0;0;1;1,y\n'
JSONL = (
    '{"path": "a/1.png", "label": "cat", "tags": [1, 3], "box": [0, 0, 0.5, 0.5]}\n'
    '{"path": "b/3.png", "label": "dog", "tags": [], "box": [0, 0, 1, 1]}\n'
)
VALUES = [{"box": [0.0, 0.0, 0.5, 0.5], "tags": [1, 3]}, {"box": [0.0, 0.0, 1.0, 1.0], "tags": []}]


@pytest.mark.parametrize(("name", "text"), [("i.csv", CSV), ("i.jsonl", JSONL)])
def test_values_are_kept_stored_last_on_the_line_and_read_back(
    root: Path, tmp_path: Path, name: str, text: str
) -> None:
    listing = list_files(str(root), index=_index(tmp_path, name, text), columns=COLUMNS)
    assert [e.values for e in listing.entries] == VALUES
    out = tmp_path / "listing"
    write_listing(listing, str(out))
    first = (out / "files.jsonl").read_text().splitlines()[0]
    assert first.endswith(',"values":{"box":[0.0,0.0,0.5,0.5],"tags":[1,3]}}')
    assert json.loads((out / "meta.json").read_text())["columns"] == {
        "box": {"max": 1, "min": 0, "type": "float[4]"},
        "tags": {"type": "int[]"},
    }
    assert read_listing(str(out)) == listing
    stored = open_stored(str(out))
    assert stored is not None and stored.columns == COLUMNS
    rows = [e for batch in stored.rows(array("I", [1, 0])).batches() for e in batch]
    assert [e.values for e in rows] == VALUES[::-1]


def test_a_listing_without_columns_keeps_its_bytes(root: Path, tmp_path: Path) -> None:
    listing = list_files(str(root), index=_index(tmp_path, "i.csv", CSV))
    out = tmp_path / "listing"
    write_listing(listing, str(out))
    lines = (out / "files.jsonl").read_text().splitlines()
    canonical = [
        json.dumps(
            {"label": lb, "label_index": i, "path": e.path, "size": e.size, "token": e.token},
            sort_keys=True,
            separators=(",", ":"),
        )
        for e, lb, i in zip(listing.entries, ["cat", "dog"], [0, 1], strict=True)
    ]
    assert lines == canonical
    assert "columns" not in json.loads((out / "meta.json").read_text())


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "i.csv",
            'path,label,tags,box\na/1.png,cat,1,"0 0 1 1"\na/2.png,cat,2,"0 0 1"\n',
            r"^.*i\.csv:3: column 'box' \(float\[4\]\): expected 4 values, found 3$",
        ),
        (
            "i.csv",
            "path,label,tags,box\na/1.png,cat,one,0 0 1 1\n",
            r"^.*i\.csv:2: column 'tags' \(int\[\]\): expected an integer, found 'one'$",
        ),
        (
            "i.csv",
            "path,label,box,tags\na/1.png,cat,0 0 1 1\n",
            r"i\.csv:2: column 'tags' \(int\[\]\): expected a cell, found none \(the row is short",
        ),
        (
            "i.csv",
            "path,label,box\na/1.png,cat,0 0 1 1\n",
            r"i\.csv:1: expected a header with 'path', 'label', 'box' and 'tags' columns, "
            r"found \['path', 'label', 'box'\]",
        ),
        (
            "i.jsonl",
            '{"path": "a/1.png", "label": "cat", "tags": [1], "box": "0 0 1 1"}\n',
            r"i\.jsonl:1: column 'box' \(float\[4\]\): expected a list of numbers, found '0 0 1 1'",
        ),
        (
            "i.jsonl",
            '{"path": "a/1.png", "label": "cat", "tags": [1]}\n',
            r"i\.jsonl:1: expected an object with 'path', 'label', 'box' and 'tags', found",
        ),
    ],
)
def test_a_malformed_cell_is_one_line_naming_file_line_column_expected_found(
    root: Path, tmp_path: Path, name: str, text: str, message: str
) -> None:
    index = _index(tmp_path, name, text)
    columns = parse_columns({"tags": "int[]", "box": "float[4]"})
    with pytest.raises(InputError, match=message) as info:
        list_files(str(root), index=index, columns=columns)
    assert "\n" not in str(info.value) and info.value.path == index


def test_columns_need_an_index_file(root: Path) -> None:
    with pytest.raises(ConfigError, match="columns: expected an index file"):
        list_files(str(root), columns=COLUMNS)
