"""Benchmark tfshards against what a user would otherwise write; print bench/README.md tables.

    make bench                                  # = python -m bench.suite.run --out bench/results
    python -m bench.suite.run --only write,bound --reps 5
    python -m bench.suite.run --scale 0.01 --reps 1 --quick   # smoke run: 1% of the images

Data: two deterministic synthetic JPEG sets, generated once under ``--data``
and reused. Every job runs each contender once to warm up, then ``--reps``
interleaved rounds (A B C, A B C, ...); ratios are taken within a round.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from typing import Annotated

import typer

# Only typer and the standard library here: process pools started with
# forkserver import this module again in every worker (as `__mp_main__`).
SECTIONS = (
    "bound", "write", "validate", "read", "sizes", "generator", "memory", "grow", "start", "show",
    "resume", "imagecheck", "cachelimit",
)  # fmt: skip


def _sections(value: str) -> tuple[str, ...]:
    picked = tuple(s.strip() for s in value.split(",") if s.strip())
    unknown = [s for s in picked if s not in SECTIONS]
    if unknown or not picked:
        raise typer.BadParameter(f"expected a comma-separated subset of {SECTIONS}, got {value!r}")
    return picked


def use_bytecode_cache() -> None:
    """Read and write ``.pyc`` files, here and in every child process.

    Where ``PYTHONDONTWRITEBYTECODE`` is set (CI machines set it), the modules
    that no install compiled (this checkout's ``src``, ``bench`` and ``tests``)
    are compiled again by every process that imports them, each pool worker
    too: a cost no installed user pays. ``make install`` compiles the packages
    it installs, so they are read from their own ``__pycache__``.
    """
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


def main(
    out: Annotated[str, typer.Option(help="Folder for latest.json and latest.md.")] = (
        "bench/results"
    ),
    only: Annotated[
        str, typer.Option(help=f"Comma-separated sections to run, of {','.join(SECTIONS)}.")
    ] = ",".join(SECTIONS),
    reps: Annotated[int, typer.Option(min=1, help="Timed rounds after the warm-up.")] = 3,
    scale: Annotated[
        float, typer.Option(min=0.0001, max=1.0, help="Fraction of the images (0.01 = 1%).")
    ] = 1.0,
    data: Annotated[
        str, typer.Option(help="Where the synthetic images are generated and kept.")
    ] = "bench/data",
    quick: Annotated[
        bool,
        typer.Option(
            help="A smoke run: no warm-up run where a section does without one, --reps "
            "rounds of the start and show commands instead of at least 5, the bound's "
            "pieces timed over one pass of their files, and the cache-limit set in 10 "
            "shards, not 80. Its numbers include "
            "imports and cold caches: a check that every section runs, not a table."
        ),
    ] = False,
) -> None:
    """Benchmark tfshards against what a user would otherwise write; print the markdown table."""
    sections = _sections(only)
    command = (
        "python -m bench.suite.run " + shlex.join(sys.argv[1:]) if sys.argv[1:] else "make bench"
    )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before anything imports TensorFlow
    use_bytecode_cache()
    from bench.suite import report
    from bench.suite.runner import log, run

    start = time.perf_counter()
    doc = run(out, sections, reps, scale, data, command.strip(), quick)
    log(f"done in {time.perf_counter() - start:.0f} s; results in {out}/latest.json")
    print(report.render(doc), end="")


if __name__ == "__main__":
    typer.run(main)
