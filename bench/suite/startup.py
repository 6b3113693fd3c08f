"""What a command costs before it does any work: fresh processes, as DVC starts each stage.

Every DVC stage, every ``--help`` and every ``--version`` is a new
interpreter, so what ``tfshards`` imports at start is paid each time. Each
command runs ``reps`` times, interleaved with the others, after one untimed
warm-up (the bytecode cache written). Wall is ``perf_counter`` around the
child; CPU is the child's user + system time (``RUSAGE_CHILDREN``). Two floors
frame the numbers: the bare interpreter and importing typer, the CLI library
every command is built on.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common.timing import spread

REPO = Path(__file__).resolve().parents[2]
AIM_S = 0.3  # a command should answer --help, or start its work, within this


def _tfshards() -> list[str]:
    """The console script beside this interpreter (what a user types), else ``-m tfshards``."""
    script = Path(sys.executable).with_name("tfshards")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tfshards"]


def commands() -> dict[str, list[str]]:
    """Name -> argv of each contender; the first two are floors, not tfshards."""
    py = sys.executable
    return {
        "python -c pass (floor)": [py, "-c", "pass"],
        "python -c 'import typer' (floor)": [py, "-c", "import typer"],
        "tfshards --version": [*_tfshards(), "--version"],
        "tfshards list --help": [*_tfshards(), "list", "--help"],
        "tfshards write --help": [*_tfshards(), "write", "--help"],
        "python stages/write_shards.py --help": [py, "stages/write_shards.py", "--help"],
    }


def stage_commands(work: str) -> dict[str, list[str]]:
    """The three data stages on a set of 8 files made in ``work``, run from the repository
    as DVC runs them beside ``params.yaml`` (each stage reads its section's keys there):
    what a stage costs before its work grows with the data."""
    from tfshards.listing.listing import list_files, write_listing
    from tfshards.project.sample import write_synthetic
    from tfshards.writing.config import WriteConfig
    from tfshards.writing.writer import write

    raw, listing = os.path.join(work, "raw"), os.path.join(work, "listing")
    shards, manifest = os.path.join(work, "shards"), os.path.join(work, "manifest.json")
    write_synthetic(raw, count=8, size=16, fmt="png", classes=2, seed=0)
    write_listing(list_files(raw), listing)
    write(WriteConfig(out=shards, manifest_copy=manifest, num_shards=2), listing)
    metrics = os.path.join(work, "metrics.json")
    write_again = ["write", listing, "--out", shards, "--manifest", manifest, "--no-progress"]
    validate = ["validate", manifest, "--metrics", metrics, "--no-progress"]
    return {
        "tfshards list (8 files)": [*_tfshards(), "list", raw, "--out", listing + "-again"],
        # the same listing again: the version is there, the write keeps it
        "tfshards write (8 files, kept)": [*_tfshards(), *write_again],
        "tfshards validate (8 records)": [*_tfshards(), *validate],
    }


def _once(argv: Sequence[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``argv`` in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, cwd=REPO, check=True, capture_output=True, env=os.environ.copy())
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def compare(reps: int, log: Callable[[str], None], warmup: bool = True) -> list[dict[str, Any]]:
    """One row per command: wall and CPU spreads over ``reps`` interleaved rounds, after one
    warm-up run of each unless ``warmup`` is false."""
    with tempfile.TemporaryDirectory(prefix="start-") as work:
        return _compare({**commands(), **stage_commands(work)}, reps, log, warmup)


def _compare(
    argvs: dict[str, list[str]], reps: int, log: Callable[[str], None], warmup: bool
) -> list[dict[str, Any]]:
    for argv in argvs.values() if warmup else ():  # warm-up: bytecode cache, page cache
        _once(argv)
    walls: dict[str, list[float]] = {name: [] for name in argvs}
    cpus: dict[str, list[float]] = {name: [] for name in argvs}
    for round_ in range(reps):
        log(f"start / round {round_ + 1} of {reps}")
        for name, argv in argvs.items():
            wall, cpu = _once(argv)
            walls[name].append(wall)
            cpus[name].append(cpu)
    return [
        {
            "group": "start",
            "name": name,
            "wall_s": spread(walls[name]),
            "cpu_s": spread(cpus[name]),
            # a smoke run's cold first runs say nothing about the aim
            "within_aim": statistics.median(walls[name]) <= AIM_S if warmup else None,
        }
        for name in argvs
    ]


def table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The start-up table, in markdown lines; nothing when the section did not run."""
    if not rows:
        return []
    lines = [
        "",
        f"#### A command's start, fresh process (aim: at most {AIM_S} s)",
        "",
        "| command | wall s (min-max) | CPU s | within the aim |",
        "|---|---:|---:|---|",
    ]
    for r in rows:
        w, c = r["wall_s"], r["cpu_s"]
        floor = "(floor)" in r["name"]
        within = r["within_aim"]
        aim = "-" if floor or within is None else ("yes" if within else "no")
        lines.append(
            f"| {r['name']} | {w['median']:.3f} ({w['min']:.3f}-{w['max']:.3f}) "
            f"| {c['median']:.3f} | {aim} |"
        )
    return lines
