"""What verifying local shards, and reading them in checked chunks, costs the loader.

``python -m bench.studies.gate_cost [IMAGES] [SIZE] [ROUNDS]`` writes IMAGES synthetic
JPEGs of SIZE px (default: the small set, 20,000 x 96 px) into 16 shards in a
temp directory, then times, page cache warm: the verification of every shard
with nothing remembered (sha256, framing walk and record count: what the
first ``make_dataset`` of a process pays), the same check once remembered (a
``stat`` per shard: every later open), and one epoch of
``make_dataset(training=False)``, decoded and not, read two ways in the same
rounds: through :mod:`tfshards.reading.chunks` (what the loader does)
and through ``TFRecordDataset`` (what it did before: it trusts a record's
length, and a header overwritten in place after verification crashed it).
The first epoch is verification plus an epoch; later epochs are an epoch.
Verification is the median of 3; epochs are ROUNDS (default 5) rounds in
which the two readers take turns, reported as the median and range of the
per-round ratios, in wall and CPU seconds (this process, all threads).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from tfshards.listing.listing import list_files
from tfshards.project.sample import write_synthetic
from tfshards.reading import gate, loader
from tfshards.shardset.manifest import Manifest
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

_KIND = {"none": "", "gzip": "GZIP", "zlib": "ZLIB"}


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _epoch(ds: Any) -> None:
    for _ in ds:
        pass


def _tfrecord_records(
    paths: Sequence[str],
    local: gate.Gate,
    *,
    shuffle_files: bool = False,
    seed: int = 0,
    cycle_length: int | None = None,
    parallel_reads: int | None = None,
    deterministic: bool | None = None,
) -> Any:
    """``loader.records_dataset`` as it was: ``TFRecordDataset`` with a 1 MB buffer per file."""
    import tensorflow as tf

    files = tf.data.Dataset.from_tensor_slices(list(paths))
    if shuffle_files and len(paths) > 1:
        files = files.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
    return files.interleave(
        lambda path: tf.data.TFRecordDataset(path, _KIND[local.compression], buffer_size=1 << 20),
        cycle_length=min(len(paths), loader.DEFAULT_CYCLE_LENGTH)
        if cycle_length is None
        else cycle_length,
        block_length=1,
        num_parallel_calls=parallel_reads,
        deterministic=deterministic if parallel_reads else None,
    )


def _epochs(manifest: Manifest, rounds: int) -> dict[tuple[str, bool, str], list[float]]:
    """Epoch seconds by (reader, decoded, clock), one per round.

    The readers take turns within each round (which goes first alternates),
    so that a paired ratio compares epochs run under the same load. CPU is
    this process's, all threads: on a shared machine it moves less than wall.
    """
    checked = loader.records_dataset
    readers: dict[str, Any] = {"chunks": checked, "TFRecordDataset": _tfrecord_records}
    datasets = {}
    for name, reader in readers.items():
        loader.records_dataset = reader  # make_dataset calls it by this name
        try:
            for decode in (True, False):
                datasets[name, decode] = loader.make_dataset(
                    manifest.shards, manifest, batch_size=128, training=False, decode=decode
                )
        finally:
            loader.records_dataset = checked
    times: dict[tuple[str, bool, str], list[float]] = {}
    for ds in datasets.values():  # warm-up: graph building, page cache
        _epoch(ds)
    for i in range(rounds):
        for name, decode in sorted(datasets, reverse=bool(i % 2)):
            wall, cpu = time.perf_counter(), time.process_time()
            _epoch(datasets[name, decode])
            times.setdefault((name, decode, "wall"), []).append(time.perf_counter() - wall)
            times.setdefault((name, decode, "CPU"), []).append(time.process_time() - cpu)
    return times


def main(images: int = 20_000, size: int = 96, rounds: int = 5) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        write_synthetic(f"{tmp}/raw", images, size, workers=2)
        config = WriteConfig(out=f"{tmp}/shards", num_shards=16, workers=2)
        manifest = write(config, list_files(f"{tmp}/raw"), progress=False).manifest
        _, local = loader.resolve_paths(manifest, manifest.shards)

        def cold() -> None:
            gate.forget()
            local.verify_all()

        verify = statistics.median(_seconds(cold) for _ in range(3))
        remembered = statistics.median(_seconds(local.verify_all) for _ in range(3))
        times = _epochs(manifest, rounds)
    mb = manifest.bytes / 1e6
    print(
        f"{images} x {size} px, {mb:.1f} MB in 16 shards: verify {verify:.3f} s "
        f"({mb / verify:.0f} MB/s), remembered {remembered * 1e3:.2f} ms; "
        f"chunks / TFRecordDataset, median (range) of {rounds} paired rounds:"
    )
    for decode, what in ((True, "decoded"), (False, "undecoded")):
        for clock in ("wall", "CPU"):
            new, old = times["chunks", decode, clock], times["TFRecordDataset", decode, clock]
            later = [n / o for n, o in zip(new, old, strict=True)]
            first = [(verify + n) / (verify + o) for n, o in zip(new, old, strict=True)]
            print(
                f"  {what} epoch, {clock}: chunks {statistics.median(new):.2f} s, "
                f"TFRecordDataset {statistics.median(old):.2f} s; "
                f"later epochs {_spread(later)}, first epoch (verify + epoch) {_spread(first)}"
            )


def _spread(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f})"


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]))
