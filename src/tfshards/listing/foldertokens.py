"""Sizes and SHA-256 of a sorted walk's files, folder by folder, hashed ahead in threads.

Each :class:`~tfshards.listing.sortedwalk.Folder` is stat'ed in one C call
and looked up in the hash cache when it is first read; the files the cache
does not know are handed to a thread pool (the C hash releases the GIL) while
the walk goes on. The walk's runs come back in order once their folder is
done, with at most :data:`AHEAD_FILES` files read ahead, so memory stays
bounded whatever the tree holds. A warm cache hashes nothing and starts no thread.
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from tfshards.listing import contenthash
from tfshards.listing.hashcache import HashCache
from tfshards.listing.sortedwalk import Folder, Run, Step

AHEAD_FILES = 8192  # files walked past the one being written: ~8 hash tasks for 2 threads
_BATCH = 1024  # files per hash task (contenthash._BATCH)


@dataclass
class Tokens:
    """A folder's files' sizes and SHA-256 digests (hex), in its name order."""

    sizes: list[int]
    hexes: list[str]


@dataclass
class _Pending:
    """A folder whose missing digests are being hashed."""

    stats: bytes | None  # taken before hashing, for the cache; None without a cache
    known: list[str | None]  # digest per name, None where hashed now
    missing: list[str]
    futures: list[Any]  # concurrent.futures.Future of contenthash._hash_local's list


@dataclass
class _Done:
    """A result computed at once, read like a future's."""

    value: list[tuple[int, bytes]]

    def result(self) -> list[tuple[int, bytes]]:
        return self.value


def _split_hex(digests: bytes) -> list[str]:
    """The 64-character hex of each 32-byte digest (one C call each way)."""
    return digests.hex(" ", 32).split(" ") if digests else []


class FolderTokens:
    """Tokens for a sorted walk's folders; :meth:`runs` yields each run once its folder is done."""

    def __init__(self, threads: int, cache: HashCache | None) -> None:
        self.threads = max(1, threads)
        self.cache = cache
        self._pool: Any = None  # a ThreadPoolExecutor once a file is hashed

    def runs(self, steps: Iterable[Step]) -> Iterator[Run]:
        """The walk's runs, in order, each with ``run.folder.result`` a :class:`Tokens`."""
        ahead: deque[Run] = deque()
        walked = 0
        try:
            for step in steps:
                if isinstance(step, Folder):
                    self._start(step)
                    walked += len(step.names)
                    continue
                ahead.append(step)
                while ahead and (
                    walked > AHEAD_FILES or not isinstance(ahead[0].folder.result, _Pending)
                ):
                    run = ahead.popleft()
                    self._finish(run.folder)
                    if run.last:
                        walked -= len(run.folder.names)
                    yield run
            while ahead:
                run = ahead.popleft()
                self._finish(run.folder)
                yield run
        finally:
            if self._pool is not None:  # on an error, do not hash the rest of the tree first
                self._pool.shutdown(cancel_futures=True)
                self._pool = None

    def _start(self, folder: Folder) -> None:
        names, cache = folder.names, self.cache
        stats: bytes | None = None
        if cache is not None:
            stats = folder.stats
            if stats is None:
                stats = contenthash.stat_local(folder.path, names)
            contenthash.check_stats(folder.path, names, stats)
            known = cache.lookup(folder.path, names, stats)
            if None not in known:
                sizes = memoryview(stats).cast("q")[2::5].tolist()
                folder.result = Tokens(sizes, known)  # type: ignore[arg-type]
                return
            missing = [n for n, d in zip(names, known, strict=True) if d is None]
        else:
            known, missing = [None] * len(names), names
        if self._pool is None and self.threads > 1:
            from concurrent.futures import ThreadPoolExecutor  # a warm re-list starts none

            self._pool = ThreadPoolExecutor(self.threads)
        futures = []
        for at in range(0, len(missing), _BATCH):
            chunk = missing[at : at + _BATCH]
            if self._pool is None:
                futures.append(_Done(contenthash._hash_local(folder.path, chunk)))
            else:
                futures.append(self._pool.submit(contenthash._hash_local, folder.path, chunk))
        folder.result = _Pending(stats, known, missing, futures)

    def _finish(self, folder: Folder) -> None:
        pending = folder.result
        if not isinstance(pending, _Pending):
            return
        hashed = list(itertools.chain.from_iterable(f.result() for f in pending.futures))
        for name, (size, _) in zip(pending.missing, hashed, strict=True):
            if size < 0:
                raise contenthash.unreadable_file(os.path.join(folder.path, name), size)
        fill = iter(hashed)
        stat_sizes = (
            memoryview(pending.stats).cast("q")[2::5].tolist()
            if pending.stats is not None
            else itertools.repeat(0)
        )
        sizes: list[int] = []
        raw: list[bytes] = []
        for digest, stat_size in zip(pending.known, stat_sizes, strict=False):
            if digest is None:
                size, got = next(fill)
                sizes.append(size)
                raw.append(got)
            else:
                sizes.append(stat_size)
                raw.append(bytes.fromhex(digest))
        digests = b"".join(raw)
        if self.cache is not None and pending.stats is not None:
            self.cache.store(folder.path, folder.names, pending.stats, digests)
        folder.result = Tokens(sizes, _split_hex(digests))
