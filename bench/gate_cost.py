"""What verifying local shards before TensorFlow reads them adds to the first epoch.

``python -m bench.gate_cost [IMAGES] [SIZE]`` writes IMAGES synthetic JPEGs of
SIZE px (default: the small set, 20,000 x 96 px) into 16 shards in a temp
directory, then times, median of 3 rounds with the page cache warm: the
verification of every shard with nothing remembered (sha256, framing walk and
record count: what the first ``make_dataset`` of a process pays), the same
check once remembered (a ``stat`` per shard: every later open), and one
decoded epoch of ``make_dataset(training=False)``.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable

from tfshards.listing.listing import list_files
from tfshards.project.sample import write_synthetic
from tfshards.reading import gate, loader
from tfshards.writing.writer import WriteConfig, write


def _median_seconds(fn: Callable[[], object], rounds: int = 3) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(images: int = 20_000, size: int = 96) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        write_synthetic(f"{tmp}/raw", images, size, workers=2)
        config = WriteConfig(out=f"{tmp}/shards", num_shards=16, workers=2)
        manifest = write(config, list_files(f"{tmp}/raw"), progress=False).manifest
        _, local = loader.resolve_paths(manifest, manifest.shards)
        assert isinstance(local, gate.Gate)

        def cold() -> None:
            gate.forget()
            local.verify_all()

        verify = _median_seconds(cold)
        remembered = _median_seconds(local.verify_all)
        ds = loader.make_dataset(manifest.shards, manifest, batch_size=128, training=False)
        for _ in ds:  # warm-up: graph building, page cache
            pass
        epoch = _median_seconds(lambda: [None for _ in ds])
    mb = manifest.bytes / 1e6
    print(
        f"{images} x {size} px, {mb:.1f} MB in 16 shards: verify {verify:.3f} s "
        f"({mb / verify:.0f} MB/s), remembered {remembered * 1e3:.2f} ms, "
        f"decoded epoch {epoch:.2f} s: first epoch +{100 * verify / epoch:.1f}%"
    )


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
