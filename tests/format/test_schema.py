"""Schema specs: dtype and shape inference from transform outputs, JSON, merging."""

from __future__ import annotations

import numpy as np
import pytest

from tfshards.errors import ConfigError, TransformError
from tfshards.format import schema


@pytest.mark.parametrize(
    ("value", "dtype", "shape"),
    [
        (b"x", "bytes", ()),
        ("é", "bytes", ()),
        (7, "int64", ()),
        (True, "int64", ()),
        (0.5, "float", ()),
        ([1, 2, 3], "int64", (3,)),
        (np.zeros((2, 3), np.uint8), "int64", (2, 3)),
        (np.ones((4,), np.float64), "float", (4,)),
    ],
)
def test_normalize_infers_dtype_and_shape(value, dtype, shape):
    got_dtype, _, got_shape = schema.normalize("f", value)
    assert (got_dtype, tuple(got_shape)) == (dtype, shape)


@pytest.mark.parametrize("value", [None, {"a": 1}, [], [1, "a"], np.array(["a"], dtype="U1")])
def test_normalize_names_feature_and_type_on_unsupported_values(value):
    with pytest.raises(TransformError, match="feature 'f'"):
        schema.normalize("f", value)


def test_schema_json_round_trip():
    specs = (schema.FeatureSpec("a", "bytes", ()), schema.FeatureSpec("b", "float", None))
    assert schema.schema_from_json(schema.schema_to_json(specs)) == specs


def test_merge_specs_makes_differing_shapes_variable():
    a = schema.FeatureSpec("x", "float", (2,))
    assert schema.merge_specs(a, schema.FeatureSpec("x", "float", (3,))).shape is None
    with pytest.raises(TransformError, match="dtype differs"):
        schema.merge_specs(a, schema.FeatureSpec("x", "int64", (2,)))


def test_feature_spec_validates_itself():
    with pytest.raises(ConfigError, match="dtype must be one of"):
        schema.FeatureSpec("x", "string")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="feature name must not be empty"):
        schema.FeatureSpec("", "bytes")
