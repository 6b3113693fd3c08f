"""The schema of a shard set: feature names, dtypes and shapes, and value normalization."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from tfshards.errors import ConfigError, TransformError

Dtype = Literal["bytes", "int64", "float"]
DTYPES: tuple[Dtype, ...] = ("bytes", "int64", "float")
Values = list[bytes] | list[int] | list[float] | np.ndarray


@dataclass(frozen=True)
class FeatureSpec:
    """One feature of the schema.

    Attributes:
        name: feature key in the Example.
        dtype: ``"bytes"``, ``"int64"`` or ``"float"``.
        shape: fixed shape (``()`` for a scalar), or None when lengths vary.
    """

    name: str
    dtype: Dtype
    shape: tuple[int, ...] | None = ()

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("feature name must not be empty")
        if self.dtype not in DTYPES:
            raise ConfigError(
                f"feature {self.name!r}: dtype must be one of {DTYPES}, got {self.dtype!r}"
            )
        if self.shape is not None and any(d < 0 for d in self.shape):
            raise ConfigError(
                f"feature {self.name!r}: shape must be non-negative, got {self.shape}"
            )

    @property
    def size(self) -> int | None:
        """Number of values in one example, or None when it varies."""
        return None if self.shape is None else int(np.prod(self.shape, dtype=np.int64))

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": None if self.shape is None else list(self.shape)}


def schema_to_json(schema: Sequence[FeatureSpec]) -> dict[str, dict[str, Any]]:
    return {spec.name: spec.to_json() for spec in sorted(schema, key=lambda s: s.name)}


def schema_from_json(data: Mapping[str, Any]) -> tuple[FeatureSpec, ...]:
    try:
        return tuple(
            FeatureSpec(
                name,
                value["dtype"],
                None if value["shape"] is None else tuple(int(d) for d in value["shape"]),
            )
            for name, value in sorted(data.items())
        )
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"malformed schema: {exc!r}") from exc


def merge_specs(a: FeatureSpec, b: FeatureSpec) -> FeatureSpec:
    """Combine what two shards saw of one feature; shapes that differ become variable."""
    if a.dtype != b.dtype:
        raise TransformError(
            f"feature {a.name!r}: dtype differs between records "
            f"(expected {a.dtype}, found {b.dtype})",
            feature=a.name,
        )
    return a if a.shape == b.shape else FeatureSpec(a.name, a.dtype, None)


def normalize(name: str, value: Any) -> tuple[Dtype, Values, tuple[int, ...]]:
    """Turn a Python/numpy value into ``(dtype, flat values, shape)``.

    Accepts bytes, str (UTF-8), bool/int, float, numpy scalars and arrays, and
    lists/tuples of one of those. Raises :class:`TransformError` naming the
    feature and the type otherwise.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes", [bytes(value) if not isinstance(value, bytes) else value], ()
    if isinstance(value, str):
        return "bytes", [value.encode()], ()
    if isinstance(value, (bool, int, np.integer, np.bool_)):
        return "int64", [int(value)], ()
    if isinstance(value, (float, np.floating)):
        return "float", [float(value)], ()
    if isinstance(value, np.ndarray):
        kind = value.dtype.kind
        if kind in "iub":
            return "int64", value.astype(np.int64).ravel(), value.shape
        if kind == "f":
            return "float", value.astype("<f4").ravel(), value.shape
        if kind in "SO" and all(isinstance(v, bytes) for v in value.ravel()):
            return "bytes", list(value.ravel()), value.shape
        raise TransformError(
            f"feature {name!r}: unsupported numpy dtype {value.dtype} "
            "(expected an integer, float or bytes array)",
            feature=name,
        )
    if isinstance(value, (list, tuple)):
        if not value:
            raise TransformError(
                f"feature {name!r}: empty list has no dtype (use a numpy array with a dtype)",
                feature=name,
            )
        kinds = {normalize(name, v)[0] for v in value}
        if len(kinds) != 1:
            raise TransformError(
                f"feature {name!r}: list mixes types {sorted(kinds)}", feature=name
            )
        (dtype,) = kinds
        flat = [normalize(name, v)[1][0] for v in value]
        return dtype, flat, (len(value),)  # type: ignore[return-value]
    raise TransformError(
        f"feature {name!r}: unsupported type {type(value).__name__} "
        "(expected bytes, str, int, float, a list of those, or a numpy array)",
        feature=name,
    )
