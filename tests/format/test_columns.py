"""Extra columns: declarations, cells of CSV and JSON lines, bounds and length multiples."""

from __future__ import annotations

import struct

import pytest

from tfshards.errors import ConfigError
from tfshards.format.columns import Column, columns_json, parse_columns, row_problem
from tfshards.format.schema import FeatureSpec


def test_declarations_give_sorted_columns_their_specs_and_canonical_json() -> None:
    columns = parse_columns(
        '{"tags": "int[]", "box": {"type": "float[4]", "min": 0, "max": 1}, "age": "float",'
        ' "boxes": {"type": "float[]", "multiple": 4}}'
    )
    assert [c.name for c in columns] == ["age", "box", "boxes", "tags"]
    assert [c.spec() for c in columns] == [
        FeatureSpec("age", "float", ()),
        FeatureSpec("box", "float", (4,)),
        FeatureSpec("boxes", "float", None),
        FeatureSpec("tags", "int64", None),
    ]
    assert columns_json(columns) == {
        "age": {"type": "float"},
        "box": {"max": 1, "min": 0, "type": "float[4]"},
        "boxes": {"multiple": 4, "type": "float[]"},
        "tags": {"type": "int[]"},
    }
    assert parse_columns(columns_json(columns)) == columns  # what meta.json holds reads back
    assert parse_columns(None) == parse_columns("none") == ()


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ('{"tags": "int[', r"columns: expected a JSON object like"),
        ('["tags"]', r"columns: expected an object of name: type, found \['tags'\]"),
        ('{"tags": "str[]"}', r"columns: tags: expected int, float, .*, found 'str\[\]'"),
        ('{"box": "float[0]"}', r"columns: box: expected a length N >= 1"),
        ('{"label": "int"}', r"columns: label: expected a feature name other than"),
        ('{"box": {"type": "float[4]", "multiple": 4}}', r"box: expected multiple only on"),
        ('{"box": {"type": "float", "min": 2, "max": 1}}', r"box: expected min <= max"),
        ('{"box": {"type": "float", "low": 0}}', r"box: expected a type or an object with keys"),
    ],
)
def test_a_bad_declaration_is_one_config_error_naming_the_column(
    declared: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_columns(declared)


def test_csv_cells_are_json_arrays_or_numbers_split_on_spaces_or_semicolons() -> None:
    tags = Column("tags", "int64", None)
    box = Column("box", "float", 4)
    age = Column("age", "float")
    cells = ("1 3 7", "1;3;7", "[1, 3, 7]", " 1 ; 3 ; 7 ")
    assert [tags.parse(cell, text=True) for cell in cells] == [[1, 3, 7]] * 4
    assert tags.parse("", text=True) == tags.parse("[]", text=True) == []
    assert box.parse("0 0.5 1 1", text=True) == [0.0, 0.5, 1.0, 1.0]
    assert isinstance(box.parse([0, 0, 1, 1])[0], float)  # JSON lines: an int is a float here
    assert age.parse("31.5", text=True) == age.parse(31.5) == 31.5
    with pytest.raises(ValueError, match="expected a list of integers, found '1 3'"):
        tags.parse("1 3")  # JSON lines hold arrays, not text


@pytest.mark.parametrize(
    ("column", "raw", "message"),
    [
        (Column("tags", "int64", None), "1 x", r"expected an integer, found 'x'"),
        (Column("tags", "int64", None), "1.5", r"expected an integer, found 1\.5"),
        (Column("box", "float", 4), "0 0 1", r"expected 4 values, found 3"),
        (Column("box", "float", 4), 3.0, r"expected a list of numbers, found 3\.0"),
        (Column("age", "float"), "1 2", r"expected one number, found '1 2'"),
        (Column("age", "float"), "nan", r"expected a finite float32, found nan"),
        (Column("age", "float"), "1e39", r"expected a finite float32, found 1e\+39"),
        (Column("boxes", "float", None, multiple=4), "1 2 3 4 5", r"multiple of 4 values, found 5"),
        (Column("tags", "int64", None), "[1, 2", r"expected a JSON array, found '\[1, 2'"),
    ],
)
def test_a_bad_cell_says_expected_and_found(column: Column, raw: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        column.parse(raw, text=isinstance(raw, str))


def test_bounds_name_the_first_value_outside_and_its_index() -> None:
    box = Column("box", "float", 4, low=0, high=1)
    assert box.out_of_bounds([0.0, 0.25, 1.0, 1.0]) is None
    assert box.out_of_bounds([0.0, 1.5, -1.0, 1.0]) == (
        "expected values in [0, 1], found 1.5 at index 1"
    )
    assert Column("age", "float", low=0).out_of_bounds([-2.0]) == (
        "expected values in [0, inf], found -2"
    )
    stored = struct.unpack("<f", struct.pack("<f", 0.1))[0]  # 0.1 as a record holds it
    assert Column("p", "float", high=0.1).out_of_bounds([stored]) is None
    assert Column("p", "float", high=0.1).out_of_bounds([0.1001]) == (
        "expected values in [-inf, 0.1], found 0.1001"
    )


def test_a_stored_row_must_hold_every_column_of_its_type() -> None:
    columns = parse_columns({"box": "float[4]", "tags": "int[]"})
    assert row_problem({"box": [0.0, 0.0, 1.0, 1.0], "tags": []}, columns) is None
    assert row_problem({"box": [0.0, 0.0, 1.0, 1.0]}, columns) == (
        "expected 'values' with keys ['box', 'tags'], found ['box']"
    )
    assert row_problem({"box": [0.0], "tags": []}, columns) == (
        "values: column 'box' (float[4]): expected 4 values, found 1"
    )
