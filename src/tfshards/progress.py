"""Progress reporting: a bar on a terminal, sparse plain lines in logs."""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType
from typing import Any

LOG_EVERY_S = 30.0  # CI logs: one line every half minute is enough to show life


def _is_terminal() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI")


def _bar(total: int | None, desc: str, unit: str) -> Any:
    """A tqdm bar on stderr. tqdm is imported here, for a terminal only: a DVC stage or a
    log pays none of its import (21 ms of a 0.45 s validate of 20,000 records, -X importtime)."""
    from tqdm import tqdm

    tqdm.monitor_interval = 0  # no monitor thread: a thread-free parent can fork workers cheaply
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, file=sys.stderr)


class Progress:
    """Counts units of work; a tqdm bar on a TTY, else a line every ``LOG_EVERY_S`` seconds.

    Args:
        desc: what is being counted, e.g. ``"write"``.
        total: expected number of units (records), or None if unknown.
        unit: the unit's name.
        enabled: False silences it entirely (library use, tests).
    """

    def __init__(
        self, desc: str, total: int | None, unit: str = "rec", enabled: bool = True
    ) -> None:
        self.desc, self.total, self.unit, self.enabled = desc, total, unit, enabled
        self.count = 0
        self.bytes = 0
        self._start = time.monotonic()
        self._last_log = self._start
        self._bar: Any = None
        if enabled and _is_terminal():
            self._bar = _bar(total, desc, unit)

    def update(self, n: int, nbytes: int = 0) -> None:
        self.count += n
        self.bytes += nbytes
        if self._bar is not None:
            self._bar.update(n)
            elapsed = max(time.monotonic() - self._start, 1e-9)
            self._bar.set_postfix_str(f"{self.bytes / elapsed / 1e6:.0f} MB/s", refresh=False)
        elif self.enabled and time.monotonic() - self._last_log >= LOG_EVERY_S:
            self._last_log = time.monotonic()
            print(self._line(), file=sys.stderr, flush=True)

    def note(self, line: str) -> None:
        """Say one line on stderr (above the bar on a terminal) unless disabled."""
        if self._bar is not None:
            self._bar.write(line, file=sys.stderr)
        elif self.enabled:
            print(line, file=sys.stderr, flush=True)

    def _line(self) -> str:
        elapsed = max(time.monotonic() - self._start, 1e-9)
        of = f"/{self.total}" if self.total is not None else ""
        rate = self.count / elapsed
        return (
            f"{self.desc}: {self.count}{of} {self.unit} in {elapsed:.0f}s "
            f"({rate:.0f} {self.unit}/s, {self.bytes / elapsed / 1e6:.0f} MB/s)"
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
