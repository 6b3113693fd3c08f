"""How big a cache directory gets: scanned at once, or sampled from a thread during a run."""

from __future__ import annotations

import os
import threading


def dir_bytes(directory: str) -> int:
    """What the cache directory holds: every file at its top (shards, sidecars, part files)."""
    total = 0
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return 0
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            pass
    return total


class Sampler:
    """The largest size of a directory seen, sampled from a thread every ~0.2 ms."""

    def __init__(self, directory: str) -> None:
        self.directory, self.peak, self.samples = directory, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.0002):
            self.peak = max(self.peak, dir_bytes(self.directory))
            self.samples += 1

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
