"""The benchmark suite and studies: their import graph, and a tiny run of every section.

The runs check the shape of the results (which rows, positive numbers), never a speed.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
# What each part of bench/ may import from bench/ besides itself: the suite and every study
# share only bench.common, and a study imports no other study.
ALLOWED = {"common": {"common"}, "suite": {"suite", "common"}, "studies": {"common"}}
SECTIONS = (
    "bound,write,validate,read,sizes,generator,memory,grow,start,show,resume,imagecheck,cachelimit"
)

WRITE = {
    "naive loop (1 process)",
    "seed recipe (Process start+join)",
    "tensorflow-datasets build",
    "tfshards (1 process)",
    "tfshards (2 threads)",
    "tfshards (2 processes)",
}
VALIDATE = {
    "eager TFRecordDataset + Example.FromString",
    "tfshards validate (1 process)",
    "tfshards validate (2 processes)",
    "tfshards validate (2 threads)",
}
READ = {
    "seed reader (parse_single_example)",
    "tensorflow-datasets as_dataset",
    "tfshards make_dataset",
}
READ_RESIZED = {
    "usual reader (parse_single_example, decode_jpeg, resize)",
    "tfshards make_dataset",
    "tfshards make_dataset, scaled_decode=False",
    "tfshards make_dataset, written with resize {side} jpeg",
    "tfshards make_dataset, written with resize {side} raw",
}
READ_BY_SIZE = {
    "usual reader (parse_single_example, decode_jpeg, resize)",
    "tfshards make_dataset",
    "tfshards make_dataset, per_record=True",
    "tfshards make_dataset, per_record=False, scaled_decode=False",
}
SIZES = (
    "32 px -> 32 px",
    "64 px -> 64 px",
    "96 px -> 96 px",
    "224 px -> 224 px",
    "512 px -> 224 px",
)
SHARD_MB = re.compile(r" \(shards ([\d.]+) MB\)$")  # the shard set's size, after some names
GENERATOR = {
    "serial from_generator",
    "seed recipe (py_function, AUTOTUNE)",
    "tfshards from_files, processes",
    "tfshards from_files, threads",
}
START = (  # bench.suite.startup.commands(): two floors, then tfshards' own starts;
    "python -c pass (floor)",
    "python -c 'import typer' (floor)",
    "tfshards --version",
    "tfshards list --help",
    "tfshards write --help",
    "python stages/write_shards.py --help",
    "tfshards list (8 files)",  # startup.stage_commands(): the data stages on 8 files
    "tfshards write (8 files, kept)",
    "tfshards validate (8 records)",
)
GRAPH = "tfshards from_files, graph (same work in TF ops)"  # only where the work is TF ops
PIECES = {"read_file", "read_shard", "sha256", "crc32c", "decode_tf", "decode_pil"}
GROW = (  # the growth section's steps, in order; at scale 0.005 the small set has 100 files
    ("full write (from scratch)", 100),
    ("grow: 1 file added (1%)", 101),
    ("grow: 5 files changed", 101),
    ("grow: 1 file removed (0.5%)", 100),
    ("the final listing from scratch", 100),
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.AST, package: str) -> list[str]:
    """Dotted names an import statement may load (``from a import b``: ``a.b``, then ``a``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*anchor, base]) if base else ".".join(anchor)
    return [f"{base}.{alias.name}" for alias in node.names]


def bench_imports() -> dict[str, set[str]]:
    """Each module under bench/ -> the bench modules it imports, lazy imports in functions too.

    Importing ``a.b.c`` also runs ``a`` and ``a.b``, so those packages count as imported.
    """
    files = {_module_name(p): p for p in BENCH.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for dotted in _imported(node, package):
                while dotted and dotted not in files:  # ``from m import function``: m
                    dotted = dotted.rpartition(".")[0]
                while dotted:  # the module and the packages above it
                    targets.add(dotted)
                    dotted = dotted.rpartition(".")[0]
        graph[name] = targets - {name, *_parents(name)}
    return graph


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` as ``[a, b, ..., a]``, or None."""
    state: dict[str, str] = {}  # "open" while on the path, "done" after

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def _part(name: str) -> str | None:
    """``suite``, ``studies`` or ``common`` for a module under them; None for ``bench`` itself."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def test_the_cycle_finder_finds_a_circle_through_lazy_imports() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    graph = bench_imports()
    # writers imports tfds_builder inside tfds_write only: the graph sees it
    assert "bench.suite.tfds_builder" in graph["bench.suite.writers"]


def test_bench_imports_form_no_circle() -> None:
    assert find_cycle(bench_imports()) is None


def test_suite_and_studies_share_only_the_common_package() -> None:
    graph = bench_imports()
    assert "bench.suite.run" in graph and "bench.studies.scale" in graph
    for name, targets in graph.items():
        part = _part(name)
        if part is None:
            continue  # bench/__init__.py
        assert part in ALLOWED, f"{name}: every bench module is in one of {sorted(ALLOWED)}"
        for target in targets:
            other = _part(target)
            if other is None:
                continue
            assert other in ALLOWED[part], f"{name} ({part}) imports {target} ({other})"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    tmp = tmp_path_factory.mktemp("bench")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)}
    args = ["--scale", "0.005", "--reps", "1", "--quick", "--only", SECTIONS]
    args += ["--out", str(tmp / "results"), "--data", str(tmp / "data")]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.suite.run", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads((tmp / "results" / "latest.json").read_text())
    assert (tmp / "results" / "latest.md").read_text() == proc.stdout
    return doc, proc.stdout


def _rows(doc: dict[str, Any], group: str) -> list[dict[str, Any]]:
    return [r for r in doc["rows"] if r["group"] == group]


def _positive_timings(r: dict[str, Any]) -> None:
    assert r["records"] > 0 and r["bytes"] > 0
    assert r["records_per_s"] > 0 and r["mb_per_s"] > 0
    wall = r["wall_s"]
    assert 0 < wall["min"] <= wall["median"] <= wall["max"]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_tiny_run_reports_every_contender_with_positive_numbers(
    results: tuple[dict[str, Any], str],
) -> None:
    doc, stdout = results
    for group, names in (("write", WRITE), ("validate", VALIDATE), ("read", READ)):
        rows = _rows(doc, group)
        assert {r["data"] for r in rows} == {"small", "large"}, group
        for data in ("small", "large"):
            assert {r["name"] for r in rows if r["data"] == data} == names, (group, data)
        for r in rows:
            _positive_timings(r)
            assert r["cpu_s"]["median"] > 0
            assert r["bound_records_per_s"] > 0 and r["of_bound"] > 0
            assert r["ratio"] is None or r["ratio"]["median"] > 0
        assert sum(r["ratio"] is None for r in rows) == 2  # one baseline per data set

    resized = _rows(doc, "read resized")  # the large set only, at two target sizes
    assert {r["data"] for r in resized} == {"large -> 224 px", "large -> 112 px"}
    for side in (224, 112):
        data = f"large -> {side} px"
        names = {SHARD_MB.sub("", r["name"]): r["name"] for r in resized if r["data"] == data}
        assert set(names) == {n.format(side=side) for n in READ_RESIZED}, data
        mb = {key: SHARD_MB.search(name) for key, name in names.items()}
        raw, jpeg = (
            mb[f"tfshards make_dataset, written with resize {side} {f}"] for f in ("raw", "jpeg")
        )
        assert raw and jpeg and float(raw[1]) > float(jpeg[1])  # raw pixels take more room
    for r in resized:
        _positive_timings(r)
        assert r["ratio"] is None or r["ratio"]["median"] > 0

    sized = _rows(doc, "read by size")  # each source side at its target side, with the count
    assert [d.split(" (")[0] for d in dict.fromkeys(r["data"] for r in sized)] == list(SIZES)
    for data in {r["data"] for r in sized}:
        assert {r["name"] for r in sized if r["data"] == data} == READ_BY_SIZE, data
    for r in sized:
        _positive_timings(r)
        assert r["ratio"] is None or r["ratio"]["median"] > 0

    generator = _rows(doc, "generator")
    expected = {
        "PIL decode+resize": GENERATOR | {GRAPH},
        "pure-Python loop": GENERATOR,
        "sleep 2 ms (I/O)": GENERATOR,
    }
    assert {r["data"] for r in generator} == set(expected)
    for kind, names in expected.items():
        assert {r["name"] for r in generator if r["data"] == kind} == names, kind
    for r in generator:
        _positive_timings(r)
        # no bound for waiting, nor for graph mode (the work is TF ops, not the timed function)
        no_bound = r["data"] == "sleep 2 ms (I/O)" or r["name"] == GRAPH
        assert (r["of_bound"] is None) == no_bound

    memory = _rows(doc, "memory")  # each write in a fresh process, at 1x and 10x the files
    assert {(r["kind"], r["records"]) for r in memory} == {
        (kind, n) for kind in ("naive", "tfds", "tfshards") for n in (10, 100)
    }
    for r in memory:
        _positive_timings(r)
        assert r["cpu_s"]["median"] > 0 and r["peak_rss_mb"]["median"] > 0

    grow = _rows(doc, "grow")  # checked for correctness by the bench itself; here the shape
    assert [(r["name"], r["records"]) for r in grow] == list(GROW)
    for r in grow:
        _positive_timings(r)
        assert r["of_full"]["median"] > 0 and r["new_shards"] > 0
    assert grow[1]["kept"] == grow[1]["previous_shards"]  # adding files rewrites no shard
    assert grow[2]["rewritten"] > 0 and grow[2]["held_changes"] <= 5

    start = _rows(doc, "start")  # fresh processes: the floors and each command's start
    assert [r["name"] for r in start] == list(START)
    for r in start:
        assert r["wall_s"]["min"] > 0 and r["cpu_s"]["median"] > 0

    show = _rows(doc, "show")  # a record of a version found in a fresh process
    assert [r["name"] for r in show] == ["tfshards show, by path", "tfshards show, by SHARD:INDEX"]
    assert all(r["records"] == 5000 and r["wall_s"]["min"] > 0 for r in show)

    checks = _rows(doc, "image checks")  # the small set written with its image checks on
    assert len(checks) == 2 and {r["data"] for r in checks} == {"small"}
    near = _rows(doc, "near-duplicates")  # validated without, then with hashes: cold, filled
    assert len(near) == 3 and {r["data"] for r in near} == {"small"}
    for r in checks + near:
        _positive_timings(r)

    resumed = _rows(doc, "resume")  # the first batch at 80% of an epoch, and at its start
    assert len(resumed) == 3 and all(r["wall_s"]["min"] > 0 for r in resumed)

    cached = _rows(doc, "cachelimit")  # epochs from moto's S3, cache unlimited and at 20%
    consumers = ["reading only", "fitting small_cnn at 16 px"]  # each: two caches, the ratio
    assert [(r["consumer"], r["name"]) for r in cached][2::3] == [(c, "ratio") for c in consumers]
    for limited in cached[1::3]:
        assert limited["peak_bytes"] <= limited["limit_bytes"] + limited["largest_shard"]
    assert all(r["wall_s"]["min"] > 0 for r in cached if r["name"] != "ratio")
    assert all(r["ratio"]["min"] > 0 for r in cached[2::3])

    bound = _rows(doc, "bound")
    assert {(r["data"], r["name"]) for r in bound} == {
        (d, p) for d in ("small", "large") for p in PIECES
    }
    assert all(r["us_per_record"] > 0 for r in bound)

    headings = ("#### Write shards", "#### Validate shards", "#### Read one epoch of decoded")
    more = (
        "#### Read one epoch of the large images resized",
        "#### Read one epoch of JPEGs of",
        "#### Grow",
        "#### A command's start",
        "#### One record of a large version",
        "#### First training batch after a resume",
        "training epochs from S3 (moto) through the shard cache",
    )
    for heading in (*headings, *more):
        assert heading in stdout
    assert "python -m bench.suite.run --scale 0.005" in stdout


@pytest.mark.slow
def test_durability_run_reports_each_writer_with_and_without_fsync(tmp_path: Path) -> None:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)}
    args = ["--scale", "0.002", "--reps", "1", "--data", str(tmp_path / "data")]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.studies.durability", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines()[2:]]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [
        (data, writer)
        for data in ("small", "large")
        for writer in ("1 process", "auto (2 workers)")
    ]
    for r in rows:
        assert float(r[2].split()[0]) > 0 and float(r[3].split()[0]) > 0
        assert float(r[4].strip().rstrip("x")) > 0
