"""What a writer reads of a listing, in memory or stored: one interface for both.

:class:`tfshards.listing.listing.Listing` holds its entries;
:class:`tfshards.listing.storedlisting.StoredListing` holds counts and a
digest, and its :class:`Rows` read their lines where they are used. A shard
task carries a :class:`Rows` to any worker: plain picklable values either way.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from tfshards.format.columns import Column
from tfshards.listing.entry import Entry


class Rows(Protocol):
    """Some entries of a listing, in record order: what one shard is written from."""

    def __len__(self) -> int: ...

    def batches(self) -> Iterator[Sequence[Entry]]:
        """The entries, in order, a bounded batch at a time where they are read from disk."""
        ...


class FileListing(Protocol):
    """Root, labels, counts, digest, paths and rows of a listing."""

    @property
    def root(self) -> str: ...

    @property
    def labels(self) -> tuple[str, ...]: ...

    @property
    def columns(self) -> tuple[Column, ...]:
        """The index file's extra columns (each entry's ``values``); empty without."""
        ...

    @property
    def files(self) -> int:
        """Number of entries."""
        ...

    @property
    def total_bytes(self) -> int: ...

    @property
    def digest(self) -> str:
        """SHA-256 (hex) of the canonical ``files.jsonl`` bytes."""
        ...

    def paths(self) -> Iterator[str]:
        """Each file's path relative to the root, in listing order."""
        ...

    def scan(self) -> Iterator[tuple[str, str, int]]:
        """Each file's ``(path, token, label id)``, in listing order, in one streamed pass."""
        ...

    def jsonl(self) -> bytes | None:
        """The stored ``files.jsonl`` as it is on disk, or None for a listing held in memory."""
        ...

    def rows(self, indices: array[int]) -> Rows:
        """The entries at ``indices`` (0-based, record order), for a shard task."""
        ...


@dataclass(frozen=True)
class EntryRows:
    """:class:`Rows` held in memory: one batch."""

    entries: tuple[Entry, ...]

    def __len__(self) -> int:
        return len(self.entries)

    def batches(self) -> Iterator[Sequence[Entry]]:
        yield self.entries
