"""Measuring helpers the suite and the studies share: process-tree CPU, peak RSS, spreads.

CPU time is that of the whole process tree: this process and its reaped
children (``getrusage``), plus every live descendant with the children it
reaped (psutil). A process pool started through a ``forkserver`` is a
grandchild that this process never reaps, so ``RUSAGE_CHILDREN`` alone would
miss it. Each process's time is counted in exactly one place at any instant
(itself while alive, its reaper once reaped), so differences of
:func:`tree_cpu_seconds` are the CPU spent in between.
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

import psutil  # type: ignore[import-untyped]


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


def spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
    }


def per_record(fn: Callable[[], object], n: int, min_seconds: float = 0.2) -> float:
    """CPU seconds per record of ``fn`` (which handles ``n`` records), repeated to >= min_seconds.

    The best of three rounds: the least disturbed by the other jobs on the machine.
    """
    best = float("inf")
    for _ in range(3):
        rounds, spent = 0, 0.0
        while not rounds or spent < min_seconds:  # at least once
            t0 = time.process_time()
            fn()
            spent += time.process_time() - t0
            rounds += 1
        best = min(best, spent / (rounds * n))
    return best
