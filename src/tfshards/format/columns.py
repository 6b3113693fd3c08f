"""Extra columns of an index file: their declared types and bounds, and their values checked.

A column is declared by name as a type, ``int`` or ``float`` (one value),
``int[]`` / ``float[]`` (any number), ``int[N]`` / ``float[N]`` (exactly N),
or as an object ``{"type": ..., "min": ..., "max": ..., "multiple": K}``:
bounds on every value (checked by validate), and for a variable list a length
that is a multiple of K (``boxes: float[]`` of ``[x0, y0, x1, y1]`` boxes: K=4).
Each column becomes a record feature of the same name: ``int64`` or
``float`` (stored as float32), of shape ``()``, ``(N,)`` or variable.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tfshards.errors import ConfigError
from tfshards.format.schema import FLOAT32_OVERFLOW, INT64_MAX, INT64_MIN, FeatureSpec
from tfshards.format.wire import Dtype

_TYPE = re.compile(r"(int|float)(?:\[(\d*)\])?")
_KEYS = frozenset({"type", "min", "max", "multiple"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")
RESERVED = ("path", "label", "sha256")  # features every record has (the payload's name too)
Value = int | float | list[int] | list[float]


@dataclass(frozen=True)
class Column:
    """One declared extra column.

    Attributes:
        name: the column (CSV header, JSON key) and the record feature it becomes.
        dtype: ``"int64"`` or ``"float"``.
        length: values per row: 0 for a scalar, N for ``[N]``, None for ``[]``.
        low, high: bounds every value must be within (inclusive), or None.
        multiple: a variable list's length is a multiple of this (1: any length).
    """

    name: str
    dtype: Dtype
    length: int | None = 0
    low: float | None = None
    high: float | None = None
    multiple: int = 1

    @property
    def type(self) -> str:
        """The declared type: ``int``, ``float[4]``, ``int[]``."""
        kind = "int" if self.dtype == "int64" else "float"
        if self.length == 0:
            return kind
        return f"{kind}[{'' if self.length is None else self.length}]"

    def spec(self) -> FeatureSpec:
        """The record feature it becomes."""
        shape = () if self.length == 0 else None if self.length is None else (self.length,)
        return FeatureSpec(self.name, self.dtype, shape)

    def to_json(self) -> dict[str, Any]:
        """The declaration, canonical: ``{"type": ...}`` plus the bounds and multiple it has."""
        doc: dict[str, Any] = {"type": self.type}
        if self.low is not None:
            doc["min"] = self.low
        if self.high is not None:
            doc["max"] = self.high
        if self.multiple != 1:
            doc["multiple"] = self.multiple
        return doc

    def parse(self, raw: Any, *, text: bool = False) -> Value:
        """A cell's value, checked for type and length; raises ``ValueError`` saying expected/found.

        ``raw`` is a JSON value (JSON lines), or with ``text`` a CSV cell: a JSON
        array (``[1, 2]``), or numbers separated by spaces or ``;`` (empty: none).
        """
        if text:
            if raw is None:  # csv.DictReader's value for a cell a short row lacks
                raise ValueError("expected a cell, found none (the row is short)")
            raw = _text_value(raw, self.length != 0)
        if self.length == 0:
            return self._number(raw)
        if not isinstance(raw, list):
            raise ValueError(f"expected a list of {self._kind}, found {_shown(raw)}")
        values = [self._number(v) for v in raw]
        self._check_length(len(values))
        return values

    def out_of_bounds(self, values: Sequence[float]) -> str | None:
        """``expected values in [0, 1], found 1.5 at index 2``, or None when all are within.

        A float column's bounds are compared as float32, as its values are
        stored: ``max: 0.1`` holds a stored 0.1 (0.100000001 as float32).
        """
        low = -math.inf if self.low is None else self.low
        high = math.inf if self.high is None else self.high
        if self.dtype == "float":
            low, high = _float32(low), _float32(high)
        for i, v in enumerate(values):
            if not low <= v <= high:
                at = "" if self.length == 0 else f" at index {i}"
                return f"expected values in [{_num(low)}, {_num(high)}], found {_num(v)}{at}"
        return None

    def length_problem(self, count: int) -> str | None:
        """Why ``count`` values do not fit a variable list (its multiple), or None."""
        if self.length is None and count % self.multiple:
            return f"expected a multiple of {self.multiple} values, found {count}"
        return None

    @property
    def _kind(self) -> str:
        return "integers" if self.dtype == "int64" else "numbers"

    def _number(self, v: Any) -> int | float:
        if self.dtype == "int64":
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"expected an integer, found {_shown(v)}")
            if not INT64_MIN <= v <= INT64_MAX:
                raise ValueError(f"expected an int64, found {v}")
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"expected a number, found {_shown(v)}")
        f = float(v)
        if not math.isfinite(f) or abs(f) >= FLOAT32_OVERFLOW:
            raise ValueError(f"expected a finite float32, found {_shown(v)}")
        return f

    def _check_length(self, count: int) -> None:
        if self.length and count != self.length:
            raise ValueError(f"expected {self.length} values, found {count}")
        problem = self.length_problem(count)
        if problem:
            raise ValueError(problem)


def row_problem(values: Any, columns: Sequence[Column]) -> str | None:
    """What is wrong with a stored row's ``values`` (one per column, each fit), or None."""
    names = [c.name for c in columns]
    if not isinstance(values, dict) or sorted(values) != names:
        found = sorted(values) if isinstance(values, dict) else type(values).__name__
        return f"expected 'values' with keys {names}, found {found}"
    for column in columns:
        try:
            column.parse(values[column.name])
        except ValueError as exc:
            return f"values: column {column.name!r} ({column.type}): {exc}"
    return None


def _text_value(text: str, is_list: bool) -> Any:
    """A CSV cell as a JSON value: an array, a list of numbers, or one number."""
    text = text.strip()
    if text.startswith("["):
        try:
            return json.loads(text)
        except ValueError:
            raise ValueError(f"expected a JSON array, found {text!r}") from None
    words = text.replace(";", " ").split()
    if not is_list and len(words) != 1:
        raise ValueError(f"expected one number, found {text!r}")
    return [_word(w) for w in words] if is_list else _word(words[0])


def _word(word: str) -> Any:
    try:
        return int(word)
    except ValueError:
        pass
    try:
        return float(word)
    except ValueError:
        return word  # _number names it


def _float32(v: float) -> float:
    """``v`` rounded to the nearest float32 (beyond its range: infinite)."""
    if abs(v) >= FLOAT32_OVERFLOW:
        return math.copysign(math.inf, v)
    return float(struct.unpack("<f", struct.pack("<f", v))[0])


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _num(v: float) -> str:
    """A bound or a stored value as text: float32 values to 7 significant digits."""
    f = float(v)
    return str(int(f)) if f.is_integer() and abs(f) < 1e15 else f"{f:.7g}"


def parse_columns(declared: str | Mapping[str, Any] | None) -> tuple[Column, ...]:
    """Columns from their declaration (a JSON object, as text or parsed), sorted by name.

    Raises:
        ConfigError: naming the column, what was expected and what was found.
    """
    if declared is None:
        return ()
    if isinstance(declared, str):
        if declared.strip().lower() in ("", "none", "null"):
            return ()
        try:
            declared = json.loads(declared)
        except ValueError as exc:
            raise ConfigError(
                f'columns: expected a JSON object like {{"tags": "int[]"}}, found {declared!r} '
                f"({exc})",
                option="columns",
            ) from None
    if not isinstance(declared, Mapping):
        raise ConfigError(
            f"columns: expected an object of name: type, found {_shown(declared)}",
            option="columns",
        )
    return tuple(_column(name, declared[name]) for name in sorted(declared))


def _column(name: Any, decl: Any) -> Column:
    def bad(expected: str, found: Any) -> ConfigError:
        return ConfigError(
            f"columns: {name}: expected {expected}, found {_shown(found)}", option="columns"
        )

    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in RESERVED:
        raise bad(f"a feature name other than {list(RESERVED)}", name)
    doc = {"type": decl} if isinstance(decl, str) else decl
    if not isinstance(doc, Mapping) or not set(doc) <= _KEYS or "type" not in doc:
        raise bad(f"a type or an object with keys {sorted(_KEYS)} (type required)", decl)
    match = _TYPE.fullmatch(str(doc["type"]).replace(" ", ""))
    if match is None:
        raise bad("int, float, int[], float[], int[N] or float[N]", doc["type"])
    kind, size = match.groups()
    length = 0 if size is None else (int(size) if size else None)
    if length is not None and size and length < 1:
        raise bad("a length N >= 1", doc["type"])
    bounds = []
    for key in ("min", "max"):
        v = doc.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise bad(f"{key} a number", v)
        bounds.append(v)
    multiple = doc.get("multiple", 1)
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise bad("multiple an integer >= 1", multiple)
    if multiple != 1 and length is not None:
        raise bad("multiple only on a variable list (int[] or float[])", doc["type"])
    low, high = bounds
    if low is not None and high is not None and low > high:
        raise bad("min <= max", doc)
    return Column(name, "int64" if kind == "int" else "float", length, low, high, multiple)


def columns_json(columns: Sequence[Column]) -> dict[str, dict[str, Any]]:
    """The declarations by name: what ``meta.json`` and the manifest's params hold."""
    return {c.name: c.to_json() for c in columns}
