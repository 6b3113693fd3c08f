"""The schema of a shard set: feature names, dtypes and shapes, and value normalization."""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from tfshards.errors import ConfigError, TransformError
from tfshards.format import wire
from tfshards.format.wire import Dtype

if TYPE_CHECKING:
    import numpy as np

DTYPES: tuple[Dtype, ...] = ("bytes", "int64", "float")
Values: TypeAlias = "list[bytes] | list[int] | list[float] | np.ndarray"


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

    @functools.cached_property  # read once per feature of every record validated
    def size(self) -> int | None:
        """Number of values in one example, or None when it varies."""
        return None if self.shape is None else math.prod(self.shape)

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


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# Floats are stored as float32: a finite value at or above this magnitude (half a step
# past the largest float32, 3.4028235e38) rounds to inf; smaller ones round to a float32.
FLOAT32_OVERFLOW = 2.0**128 - 2.0**103


def normalize(name: str, value: Any) -> tuple[Dtype, Values, tuple[int, ...]]:
    """Turn a Python/numpy value into ``(dtype, flat values, shape)``.

    Accepts bytes, str (UTF-8), bool/int (int64 range), float, numpy scalars
    and arrays, and lists/tuples of one of those. Nested lists that are
    rectangular are flattened row-major with their shape, exactly like the
    numpy array they would make. Raises :class:`TransformError` naming the
    feature for anything else: a wrong value is never stored silently.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes", [bytes(value) if not isinstance(value, bytes) else value], ()
    if isinstance(value, str):
        return "bytes", [_utf8(name, value)], ()
    # numpy is not imported here (0.3 s at every start); a value can only be a numpy
    # object when whoever made it has imported numpy already.
    np = sys.modules.get("numpy")
    if isinstance(value, (bool, int)) or (np and isinstance(value, (np.integer, np.bool_))):
        return "int64", [_int64(name, int(value))], ()
    if isinstance(value, float) or (np and isinstance(value, np.floating)):
        return "float", [_float32(name, float(value))], ()
    if np and isinstance(value, np.ndarray):
        return _array(name, value)
    if isinstance(value, (list, tuple)):
        return _sequence(name, value)
    raise TransformError(
        f"feature {name!r}: unsupported type {type(value).__name__} "
        "(expected bytes, str, int, float, a list of those, or a numpy array)",
        feature=name,
    )


def _utf8(name: str, value: str) -> bytes:
    try:
        return value.encode()
    except UnicodeEncodeError as exc:
        raise TransformError(
            f"feature {name!r}: expected text that encodes as UTF-8, found "
            f"{value[exc.start : exc.end]!r} at character {exc.start} ({exc.reason})",
            feature=name,
        ) from None


def _int64(name: str, value: int) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise TransformError(
            f"feature {name!r}: expected an int64 ({INT64_MIN}..{INT64_MAX}), found {value}",
            feature=name,
        )
    return value


def _float32(name: str, value: float, where: str = "") -> float:
    if abs(value) >= FLOAT32_OVERFLOW and math.isfinite(value):
        raise TransformError(
            f"feature {name!r}: expected a float32 (magnitude below {FLOAT32_OVERFLOW:.8g}; "
            f"floats are stored as float32), found {value!r}{where}",
            feature=name,
        )
    return value


def _array(name: str, value: np.ndarray) -> tuple[Dtype, Values, tuple[int, ...]]:
    import numpy as np

    kind = value.dtype.kind
    if kind in "iub":
        if kind == "u" and value.size and value.max() > INT64_MAX:
            _int64(name, int(value.max()))  # raises: uint64 values above int64 would wrap
        return "int64", value.astype(np.int64).ravel(), value.shape
    if kind == "f":
        if value.dtype.itemsize <= 4:  # float16 and float32 fit
            return "float", value.astype(wire.FLOAT32).ravel(), value.shape
        with np.errstate(over="ignore"):  # an overflow is refused below, not warned about
            flat = value.astype(wire.FLOAT32).ravel()
        if not np.isfinite(flat).all():
            wide = value.ravel()
            overflowed = np.flatnonzero(np.isinf(flat) & np.isfinite(wide))
            if overflowed.size:
                i = int(overflowed[0])
                _float32(name, float(wide[i]), f" at index {i} of shape {list(value.shape)}")
        return "float", flat, value.shape
    if kind in "SO" and all(isinstance(v, bytes) for v in value.ravel()):
        return "bytes", list(value.ravel()), value.shape
    raise TransformError(
        f"feature {name!r}: unsupported numpy dtype {value.dtype} "
        "(expected an integer, float or bytes array)",
        feature=name,
    )


def _sequence(
    name: str, value: list[Any] | tuple[Any, ...]
) -> tuple[Dtype, Values, tuple[int, ...]]:
    if not value:
        raise TransformError(
            f"feature {name!r}: empty list has no dtype (use a numpy array with a dtype)",
            feature=name,
        )
    parts = [normalize(name, v) for v in value]
    kinds = {p[0] for p in parts}
    if len(kinds) != 1:
        raise TransformError(f"feature {name!r}: list mixes types {sorted(kinds)}", feature=name)
    dtype, _, inner = parts[0]
    for i, (_, _, shape) in enumerate(parts):
        if shape != inner:
            raise TransformError(
                f"feature {name!r}: nested lists must be rectangular: expected item {i} "
                f"of shape {list(inner)} like item 0, found shape {list(shape)}",
                feature=name,
            )
    if not inner:  # a flat list of scalars: the common case
        return dtype, [p[1][0] for p in parts], (len(value),)  # type: ignore[return-value]
    flat = [v for p in parts for v in p[1]]
    return dtype, flat, (len(value), *inner)  # type: ignore[return-value]
