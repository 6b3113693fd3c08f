"""Time contenders side by side: warm-up, interleaved repetitions, wall and CPU time.

CPU is the whole process tree's (:func:`bench.common.timing.tree_cpu_seconds`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.common.timing import spread, tree_cpu_seconds

# (records, bytes) processed by one run; bytes are the payload bytes it handled.
Work = tuple[int, int]


@dataclass
class Sample:
    wall: float
    cpu: float
    records: int
    bytes: int


@dataclass
class Contender:
    """One way of doing the job: ``run(workdir)`` does it once, returns (records, bytes).

    ``workdir`` is a fresh empty directory per run (removed after, untimed).
    """

    name: str
    run: Callable[[str], Work]
    note: str = ""
    samples: list[Sample] = field(default_factory=list)
    warmup: Sample | None = None


class Epochs:
    """A ``run`` that builds its dataset on the first call and iterates one epoch per call.

    The warm-up run pays the build (tracing, pool start) and the first epoch;
    the timed runs are the epochs after it, what a training loop sees.
    """

    def __init__(self, build: Callable[[], Any], payload: int) -> None:
        self.build, self.payload = build, payload
        self.dataset: Any = None

    def __call__(self, workdir: str) -> Work:
        if self.dataset is None:
            self.dataset = self.build()
        records = 0
        for batch in self.dataset:
            first = batch[0] if isinstance(batch, tuple) else batch
            records += int(first.shape[0])
        return records, self.payload


def measure(fn: Callable[[str], Work], workroot: str) -> Sample:
    """Run ``fn`` once in a fresh directory; time it (wall and process-tree CPU)."""
    workdir = tempfile.mkdtemp(dir=workroot)
    try:
        cpu0 = tree_cpu_seconds()
        t0 = time.perf_counter()
        records, nbytes = fn(workdir)
        wall = time.perf_counter() - t0
        cpu = tree_cpu_seconds() - cpu0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return Sample(wall, cpu, records, nbytes)


def compare(
    contenders: Sequence[Contender],
    reps: int,
    workroot: str,
    log: Callable[[str], None],
    warmup: bool = True,
) -> None:
    """One warm-up run of each (unless ``warmup`` is false), then ``reps`` rounds A B C,
    A B C, ... (samples appended)."""
    for c in contenders if warmup else ():
        c.warmup = measure(c.run, workroot)
        log(f"  warm-up  {c.name:<40} {c.warmup.wall:7.2f} s")
    for rep in range(reps):
        for c in contenders:
            s = measure(c.run, workroot)
            c.samples.append(s)
            log(f"  rep {rep + 1}/{reps} {c.name:<40} {s.wall:7.2f} s  cpu {s.cpu:7.2f} s")


def row(
    group: str,
    data: str,
    c: Contender,
    baseline: Contender | None,
    bound_rps: float | None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Summarise a contender: medians with min/max, and its ratio to ``baseline``.

    The ratio is taken per repetition (baseline wall / contender wall, runs of
    the same round), so a slow patch of the shared machine hits both sides.
    """
    walls = [s.wall for s in c.samples]
    wall = spread(walls)
    records, nbytes = c.samples[0].records, c.samples[0].bytes
    if any(s.records != records for s in c.samples):
        raise RuntimeError(f"{group}/{c.name}: record count changed between repetitions")
    rps = records / wall["median"]
    out: dict[str, Any] = {
        "group": group,
        "data": data,
        "name": c.name,
        "note": c.note,
        "records": records,
        "bytes": nbytes,
        "reps": len(walls),
        "wall_s": wall,
        "cpu_s": spread([s.cpu for s in c.samples]),
        "records_per_s": rps,
        "mb_per_s": nbytes / 1e6 / wall["median"],
        "peak_rss_mb": None,
        "warmup_s": None if c.warmup is None else c.warmup.wall,
        "baseline": None,
        "ratio": None,
        "bound_records_per_s": bound_rps,
        "of_bound": rps / bound_rps if bound_rps else None,
    }
    if baseline is not None:
        pairs = [b.wall / s.wall for b, s in zip(baseline.samples, c.samples, strict=True)]
        out["baseline"] = baseline.name
        out["ratio"] = spread(pairs)
    out.update(extra or {})
    return out


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
