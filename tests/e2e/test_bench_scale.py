"""Smoke test of the scale series: tiny trees, every step in a fresh process, one row per size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_scale_series_prints_a_row_per_size_with_memory_against_the_first(tmp_path: Path) -> None:
    rows_path = tmp_path / "rows.json"
    args = ["--files", "300,600", "--file-bytes", "64", "--dir", str(tmp_path / "trees"), "--usual"]
    result = subprocess.run(
        [sys.executable, "-m", "bench.studies.scale", *args, "--json", str(rows_path)],
        cwd=tmp_path,  # whatever it writes stays out of the checkout
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    lines = result.stdout.strip().splitlines()
    table, usual = lines[: lines.index("")], lines[lines.index("") + 3 :]
    assert [line.split(" | ")[0] for line in table[2:]] == ["| 300", "| 600"]
    assert "(1.00x)" in table[2]
    # the second table: three rows a size against the usual recipes
    assert [line.split(" | ")[0] for line in usual] == ["| 300"] * 3 + ["| 600"] * 3
    assert all(line.endswith("x |") for line in usual)
    rows = json.loads(rows_path.read_text())
    assert [r["files"] for r in rows] == [300, 600]
    for row in rows:
        steps = [row[s] for s in ("list", "list_warm", "write", "validate")]
        for step in [*steps, row["usual"]["write"], row["usual"]["check"]]:
            assert step["wall"] > 0 and step["rss_mb"] > 0
    assert not (tmp_path / "trees").exists()  # removed without --keep
