"""The arithmetic of ``bench.studies.dask_cost``: costs from two runs, and where two lines meet."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# bench/ runs as `python -m bench.<package>.<module>` from the repository root; it is not installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.studies.dask_cost import crossover, line, render


def test_a_line_goes_through_the_first_and_last_runs():
    fixed, per_shard = line([2, 128], [0.06, 0.186])
    assert fixed == pytest.approx(0.058) and per_shard == pytest.approx(0.001)


def test_a_cluster_with_a_lower_per_file_cost_catches_up_where_the_lines_meet():
    processes, cluster = (0.05, 3e-5), (0.20, 2e-5)
    assert crossover(processes, cluster) == pytest.approx(15_000)
    assert crossover(processes, cluster, within=1.1) == pytest.approx(
        (0.20 - 0.055) / (3.3e-5 - 2e-5)
    )


def test_a_cluster_whose_per_file_cost_is_not_lower_never_catches_up():
    assert crossover((0.05, 3e-5), (0.20, 3e-5)) is None


def test_an_already_faster_contender_is_as_fast_from_zero_files():
    assert crossover((0.05, 3e-5), (0.01, 2e-5)) == 0.0


def test_the_table_leaves_the_baseline_and_local_cluster_uncompared():
    row = {
        "fixed_s": 1.0,
        "per_shard_ms": 1.0,
        "per_1000_files_s": -0.05,
        "largest_s": 1.0,
        "crossover_files": 12.0,
        "within_10pct_files": None,
    }
    doc = {
        "files": [1250, 20000],
        "rows": [{**row, "name": "dask LocalCluster"}, {**row, "name": "dask scheduler"}],
    }
    local, remote = render(doc).splitlines()[2:]
    assert local == "| dask LocalCluster | 1.00 | 1.0 | — | 1.00 | — | — |"
    assert remote.endswith("| ~12 files | never (per-file cost not lower) |")
