"""Verify local shards against the manifest before any record is read, remembered by stat.

Before a local shard is read, :func:`verify` reads it once in pieces (bounded
memory): its size and sha256 must match the manifest, its framing (every
length and length CRC, every record inside the file; gzip/zlib streams
inflated piece by piece) must hold and its record count must match, so a
shard cut at a record boundary cannot read short. The walk also cuts the
shard into record-aligned chunks of ~``CHUNK_BYTES`` (its *layout*), which
:mod:`tfshards.reading.chunks` reads back, checking each chunk's framing and
CRCs as it reads: a file that changes after it was verified (an edit in place
within one timestamp tick leaves its stat unchanged) is never trusted, only
refused. A verified file is remembered by path, size, mtime, ctime and inode
in this process: the check costs once, and each later open (every epoch)
costs one ``stat``. Copies of remote shards in the cache, whose sha256 the
cache checks, get the same framing walk and count without a second hash.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from tfshards.errors import RecordError, ShardError
from tfshards.format.tfrecord import FrameCounter
from tfshards.reading import pins
from tfshards.shardset import check
from tfshards.shardset.manifest import ShardInfo

# Records are read back in record-aligned chunks of about this many (uncompressed) bytes:
# TFRecordDataset's read buffer was 1 MB too; 16 files open at once hold ~16 MB.
CHUNK_BYTES = 1 << 20

_lock = threading.Lock()
# path -> what its stat and manifest entry were, and its layout
_verified: dict[str, tuple[tuple[int, ...], np.ndarray]] = {}


def _key(st: os.stat_result, shard: ShardInfo) -> tuple[int, ...]:
    # The sha256 (as an int) and record count too: another manifest's entry is checked anew.
    return (
        st.st_size,
        st.st_mtime_ns,
        st.st_ctime_ns,
        st.st_ino,
        int(shard.sha256, 16),
        shard.records,
    )


def verify(
    path: str, shard: ShardInfo, compression: str, where: str, *, check_sha: bool = True
) -> np.ndarray:
    """Raise unless the local file ``path`` is ``shard`` as the manifest describes it.

    Returns its layout: one int64 row ``(start, end, first record, records)``
    per record-aligned chunk, in (uncompressed) stream offsets, covering the
    whole stream; no rows for a shard with no records.

    Args:
        path: the local file.
        shard: its manifest entry.
        compression: the manifest's compression (``none``, ``gzip`` or ``zlib``).
        where: how errors name the shard (its URL).
        check_sha: hash it too; False for a copy whose hash the cache has checked.

    Raises:
        ShardError: missing, or size, sha256 or record count differ
            (:mod:`tfshards.shardset.check`'s words).
        RecordError: the bytes match the manifest, but a record's framing is broken.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ShardError(f"{where}: {check.missing(shard)}", shard=shard.name, path=path) from None
    if st.st_size != shard.bytes:
        what = check.size_mismatch(shard, st.st_size)
        raise ShardError(f"{where}: {what}", shard=shard.name, path=path)
    key = _key(st, shard)
    with _lock:
        known = _verified.get(path)
        if known is not None and known[0] == key:
            return known[1]
    found = _read(path, compression, check_sha)
    for what, index, offset in check.mismatches(shard, found):
        if index is not None:
            raise RecordError(
                f"{where}: record {index} at byte {offset}: {what}",
                shard=shard.name,
                index=index,
                offset=offset,
                path=path,
            )
        extra = {} if found.sha256 in (None, shard.sha256) else {"found_sha256": found.sha256}
        raise ShardError(f"{where}: {what}", shard=shard.name, path=path, **extra)
    layout = _layout(found.walk)
    with _lock:
        _verified[path] = (key, layout)
    return layout


def _layout(walk: FrameCounter) -> np.ndarray:
    """The chunks the walk cut the stream into, the last one ending where the stream ends."""
    cuts = list(walk.cuts)
    if walk.records and (not cuts or cuts[-1][0] != walk.offset):
        cuts.append((walk.offset, walk.records))
    rows = np.zeros((len(cuts), 4), dtype=np.int64)
    start = first = 0
    for i, (end, records) in enumerate(cuts):
        rows[i] = (start, end, first, records - first)
        start, first = end, records
    return rows


def _read(path: str, compression: str, check_sha: bool) -> check.Found:
    """The file read once: its sha256 (if asked), its framing walk cut into chunks."""
    return check.read_file(path, compression, hashed=check_sha, chunk_bytes=CHUNK_BYTES)


def forget(path: str | None = None) -> None:
    """Drop what was verified (of ``path``, or of every file)."""
    with _lock:
        if path is None:
            _verified.clear()
        else:
            _verified.pop(path, None)


class Gate:
    """:func:`verify` each time TensorFlow is about to open a shard (``Fetch.wait``'s role).

    Args:
        entries: local path -> (its manifest entry, the URL errors name it by).
        compression: the manifest's compression.
        before: called with the path first (a cache's ``Fetch.wait``: download and hash;
            a limited cache's also pins the file until :meth:`done`).
        check_sha: hash each file; False when ``before`` has.
        expect: told the order the reader will open shards in next (a limited cache's
            ``BoundedFetch.expect``: its lookahead follows it).
    """

    def __init__(
        self,
        entries: Mapping[str, tuple[ShardInfo, str]],
        compression: str,
        *,
        before: Callable[[str], str] | None = None,
        check_sha: bool = True,
        expect: Callable[[Sequence[str]], None] | None = None,
    ) -> None:
        self._entries = dict(entries)
        self.compression, self.before, self.check_sha = compression, before, check_sha
        self._expect = expect

    def expect(self, paths: Sequence[str]) -> None:
        """Say the shards the reader opens next, in order (no-op unless a limited cache fetches)."""
        if self._expect is not None:
            self._expect(paths)

    def wait(self, path: str) -> str:
        """Verify the shard at ``path`` (a ``stat`` once verified); returns ``path``."""
        self.layout(path)
        return path

    def layout(self, path: str) -> np.ndarray:
        """Verify the shard at ``path`` (a ``stat`` once verified); returns its layout."""
        if self.before is None:
            shard, where = self._entries[path]
            return verify(path, shard, self.compression, where, check_sha=self.check_sha)
        self.before(path)
        try:
            shard, where = self._entries[path]
            rows = verify(path, shard, self.compression, where, check_sha=self.check_sha)
        except BaseException:
            self.done(path)
            raise
        if not len(rows):
            self.done(path)  # nothing will be read from it
        return rows

    def done(self, path: str) -> None:
        """The reader is through with ``path`` (read its last chunk): one pin on it goes."""
        if self.before is not None:
            pins.release(path)

    def entry(self, path: str) -> tuple[ShardInfo, str]:
        """The manifest entry of the shard at ``path``, and the URL errors name it by."""
        return self._entries[path]

    def verify_all(self, workers: int = 4) -> None:
        """Verify every shard now, a few at a time; raise the first failure in order."""
        with cf.ThreadPoolExecutor(max(1, min(workers, len(self._entries)))) as pool:
            for _ in pool.map(self.wait, list(self._entries)):
                pass
