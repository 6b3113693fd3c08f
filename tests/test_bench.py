"""Smoke test of the benchmark suite: every section runs at a tiny scale and reports sane rows.

It checks the shape of the results (which rows, positive numbers), never a speed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SECTIONS = "bound,write,validate,read,generator,memory"

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
SHARD_MB = re.compile(r" \(shards ([\d.]+) MB\)$")  # the shard set's size, after some names
GENERATOR = {
    "serial from_generator",
    "seed recipe (py_function, AUTOTUNE)",
    "tfshards from_files, processes",
    "tfshards from_files, threads",
}
GRAPH = "tfshards from_files, graph (same work in TF ops)"  # only where the work is TF ops
PIECES = {"read_file", "read_shard", "sha256", "crc32c", "decode_tf", "decode_pil"}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    tmp = tmp_path_factory.mktemp("bench")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)}
    args = ["--scale", "0.005", "--reps", "1", "--only", SECTIONS]
    args += ["--out", str(tmp / "results"), "--data", str(tmp / "data")]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", *args],
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

    bound = _rows(doc, "bound")
    assert {(r["data"], r["name"]) for r in bound} == {
        (d, p) for d in ("small", "large") for p in PIECES
    }
    assert all(r["us_per_record"] > 0 for r in bound)

    headings = ("#### Write shards", "#### Validate shards", "#### Read one epoch of decoded")
    for heading in (*headings, "#### Read one epoch of the large images resized"):
        assert heading in stdout
    assert "python -m bench.run --scale 0.005" in stdout


@pytest.mark.slow
def test_durability_run_reports_each_writer_with_and_without_fsync(tmp_path: Path) -> None:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)}
    args = ["--scale", "0.002", "--reps", "1", "--data", str(tmp_path / "data")]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.durability", *args],
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
