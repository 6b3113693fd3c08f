"""Time contenders side by side: warm-up, interleaved repetitions, wall and CPU time.

CPU time is that of the whole process tree: this process and its reaped
children (``getrusage``), plus every live descendant with the children it
reaped (psutil). A process pool started through a ``forkserver`` is a
grandchild that this process never reaps, so ``RUSAGE_CHILDREN`` alone would
miss it. Each process's time is counted in exactly one place at any instant
(itself while alive, its reaper once reaped), so differences of
:func:`tree_cpu_seconds` are the CPU spent in between.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil  # type: ignore[import-untyped]

# (records, bytes) processed by one run; bytes are the payload bytes it handled.
Work = tuple[int, int]


def tree_cpu_seconds() -> float:
    """User + system seconds of this process, its reaped children and all live descendants."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    for proc in psutil.Process().children(recursive=True):
        try:
            t = proc.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # gone: its time is now in its reaper's children times
        total += t.user + t.system + t.children_user + t.children_system
    return total


def run_sampled(cmd: list[str], env: dict[str, str], what: str) -> tuple[float, bytes, RssSampler]:
    """Run ``cmd`` to its end, sampling the RSS of its process tree: wall s, stdout, sampler.

    A non-zero exit raises ``RuntimeError`` naming ``what``, with the child's stderr.
    """
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with RssSampler(proc.pid) as sampler:
        out, err = proc.communicate()
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}):\n{err.decode()}")
    return wall, out, sampler


class RssSampler:
    """Peak of the summed RSS of a process and its descendants, sampled every ``interval`` s.

    Also keeps the largest per-process high-water mark (``VmHWM``), which is
    exact for processes still alive at their last sample.
    """

    def __init__(self, pid: int | None = None, interval: float = 0.02) -> None:
        self.root = psutil.Process(pid)
        self.interval = interval
        self.peak_sum = 0
        self.peak_single = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval):
                return

    def sample(self) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        total = 0
        for proc in procs:
            try:
                total += proc.memory_info().rss
                self.peak_single = max(self.peak_single, _hwm_bytes(proc.pid))
            except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
                continue
        self.peak_sum = max(self.peak_sum, total)


def _hwm_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


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
    contenders: Sequence[Contender], reps: int, workroot: str, log: Callable[[str], None]
) -> None:
    """One warm-up run of each, then ``reps`` rounds A B C, A B C, ... (samples appended)."""
    for c in contenders:
        c.warmup = measure(c.run, workroot)
        log(f"  warm-up  {c.name:<40} {c.warmup.wall:7.2f} s")
    for rep in range(reps):
        for c in contenders:
            s = measure(c.run, workroot)
            c.samples.append(s)
            log(f"  rep {rep + 1}/{reps} {c.name:<40} {s.wall:7.2f} s  cpu {s.cpu:7.2f} s")


def spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
    }


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
