"""Where a shard's records come from: one small source per way a file becomes a record.

A source frames a batch of entries into the shard's
:class:`~tfshards.format.recordbuffer.RecordBuffer` and yields ``(entry,
problem)`` for each file that cannot become a record; the shard writer
(:mod:`tfshards.writing.shard`) decides whether that is a reject or a failure.
Three sources: local files framed in bulk (:class:`LocalFiles`), bytes
fetched from storage (:class:`FetchedFiles`), and transformed or resized
files (:class:`tfshards.writing.features.FeatureFiles`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tfshards import storage
from tfshards.errors import InputError
from tfshards.format.imageformat import NotAnImage, claims_image
from tfshards.format.recordbuffer import ContentChanged, FileChanged, RecordBuffer, copy_into
from tfshards.listing.contenthash import expected_sha256
from tfshards.listing.entry import Entry
from tfshards.writing.fileproblem import check_md5, file_problem

Problems = Iterator[tuple[Entry, OSError | InputError]]


class RecordSource(Protocol):
    """Frames entries into a shard's buffer, in order; yields each file it could not frame."""

    def frame(self, buffer: RecordBuffer, entries: Sequence[Entry]) -> Problems: ...


@dataclass(frozen=True)
class LocalFiles:
    """Local files ``prefix + path``, framed a buffer at a time (in C, without the GIL)."""

    prefix: str

    def frame(self, buffer: RecordBuffer, entries: Sequence[Entry]) -> Problems:
        expected = b"".join(expected_sha256(e.token) or bytes(32) for e in entries)
        for i, problem in buffer.add_local_files(self.prefix, entries, expected):
            entry = entries[i]
            yield entry, file_problem(problem, entry.path, entry.size, self.prefix + entry.path)


@dataclass(frozen=True)
class FetchedFiles:
    """Files on other storage: each fetched whole, checked against its token, copied in."""

    fs: Any
    prefix: str

    def frame(self, buffer: RecordBuffer, entries: Sequence[Entry]) -> Problems:
        for entry in entries:
            rel, size, label, token, _ = entry
            try:
                data = storage.read_bytes(self.fs, self.prefix + rel, size_hint=size)
                if len(data) == size:  # else the size error says more
                    check_md5(data, token, rel)
                buffer.add_file(
                    size, label, rel.encode(), copy_into, data, expected_sha256(token),
                    claims_image(rel),
                )  # fmt: skip
            except (FileChanged, ContentChanged, NotAnImage) as exc:
                yield entry, file_problem(exc, rel, size)
            except (OSError, InputError) as exc:
                yield entry, exc
