"""The error tree: each class declares its typed attributes, and they survive pickling."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest

from tfshards import errors

SRC = Path(__file__).resolve().parents[1] / "src" / "tfshards"
CLASSES = {
    name: cls
    for name, cls in vars(errors).items()
    if isinstance(cls, type) and issubclass(cls, errors.TfshardsError)
}


def _raised_with_keywords() -> list[tuple[str, str, str]]:
    """``(where, class name, keyword)`` for every keyword given to an error class in src."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name in CLASSES:
                where = f"{path.relative_to(SRC)}:{node.lineno}"
                found += [(where, name, kw.arg) for kw in node.keywords if kw.arg is not None]
    return found


def test_every_attribute_given_to_an_error_is_declared_by_its_class():
    given = _raised_with_keywords()
    assert len(given) > 20  # the scan sees the raises (path=, shard=, line=, ...)
    undeclared = [g for g in given if g[2] not in errors.declared(CLASSES[g[1]])]
    assert undeclared == []


def test_an_undeclared_attribute_reads_as_none_not_attribute_error():
    exc = errors.RecordError("data-00000-of-00002: record 3: bad CRC", shard="data-00000-of-00002")
    assert (exc.shard, exc.index, exc.offset, exc.path) == ("data-00000-of-00002", None, None, None)


@pytest.mark.parametrize(
    "exc",
    [
        errors.RecordError("s: record 3", shard="s", index=3, offset=120),
        errors.TransformOutputError("t: returned list", transform="m:f", feature="x"),
        errors.ValidationError("2 problems", problems=["a", "b"], problem_count=2),
    ],
)
def test_errors_pickle_with_their_class_and_attributes(exc):
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc) and str(back) == str(exc) and vars(back) == vars(exc)


def test_a_transform_output_error_is_a_transform_error():
    """Callers that catch TransformError (or InputError) still catch it."""
    assert issubclass(errors.TransformOutputError, errors.TransformError)
    assert "transform" in errors.declared(errors.TransformOutputError)


def test_a_line_quoting_a_huge_value_is_cut_saying_how_much_more():
    """A 50,000-column header, quoted whole, was a 489 KB error line."""
    text = "x.csv:1: expected a header, found " + "k, " * 100_000 + "(its end)"
    line = errors.one_line(text)
    assert len(line) <= errors.LONGEST_LINE and line.startswith("x.csv:1: expected a header")
    keep = (errors.LONGEST_LINE - 40) // 2
    assert f" ... ({len(text) - 2 * keep:,} characters) ... " in line
    assert line.endswith("k, (its end)")
    assert errors.one_line("short\nline") == "short\\nline"
