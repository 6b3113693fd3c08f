"""Training reads through a limited shard cache, against an unlimited one: the measured run.

The set lives on moto's S3 server, started in its own process on 127.0.0.1
(so serving does not share the reader's GIL), or on ``memory://`` in this
process, where a download costs a copy and the limit's own work (locks,
scans, eviction, the rewrites to disk) is what is measured. Each run starts
from an empty cache directory and reads 3 epochs (``training=True``, decoded,
batched) in this process; unlimited, epoch 1 downloads the whole set and
epochs 2 and 3 read local copies; limited, every epoch downloads what was
evicted. A thread samples the cache directory's size throughout.

A run either only iterates the batches (the input alone: the cache's worst
case, every download on the critical path) or fits the train stage's
``small_cnn`` on them at ``train_size`` pixels (Keras ``fit``, the model built
and compiled before the clock starts), as the train stage consumes them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bench.common.timing import tree_cpu_seconds

SHARE = 0.2  # the limit, as a share of the set's bytes
EPOCHS = 3


@dataclass(frozen=True)
class Run:
    """One read of :data:`EPOCHS` epochs: wall and CPU seconds (the moto server's too), and
    the most bytes the cache directory held."""

    wall_s: float
    cpu_s: float
    peak_bytes: int


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def store(kind: str) -> Iterator[dict[str, Any]]:
    """Storage options for ``kind`` (``s3``: a moto server of its own, a bucket ``bench``;
    ``memory``: none); the server stops on exit."""
    if kind != "s3":
        yield {}
        return
    port = _free_port()
    server = os.path.join(os.path.dirname(sys.executable), "moto_server")
    proc = subprocess.Popen(
        [server, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        options = {"endpoint_url": url, "key": "testing", "secret": "testing"}
        import s3fs  # type: ignore[import-untyped]

        s3fs.S3FileSystem(**options).mkdir("bench")
        yield options
    finally:
        proc.terminate()
        proc.wait()


def write_set(listing: Any, kind: str, shards: int, options: dict[str, Any]) -> Any:
    """Write ``listing`` into ``shards`` shards on ``kind``'s store; returns the manifest."""
    from tfshards.writing.config import WriteConfig
    from tfshards.writing.writer import write

    config = WriteConfig(
        out=f"{kind}://bench/shards", num_shards=shards, executor="serial", out_options=options
    )
    return write(config, listing, progress=False).manifest


def _model(size: int, classes: int) -> Any:
    """The train stage's ``small_cnn`` for ``size`` px RGB images, compiled with Adam."""
    import keras

    from tfshards.training.models import build_model

    keras.utils.set_random_seed(0)
    model = build_model("small_cnn", image_size=size, channels=3, classes=classes)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def _dir_bytes(directory: str) -> int:
    total = 0
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return 0
    for entry in entries:
        with contextlib.suppress(FileNotFoundError):
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
    return total


def epochs(
    manifest: Any,
    options: dict[str, Any],
    limit: int | None,
    batch: int,
    train_size: int | None = None,
) -> Run:
    """Read :data:`EPOCHS` epochs from an empty cache directory (``limit`` None: no limit);
    with ``train_size``, fit ``small_cnn`` on them at that size instead of only reading."""
    from tfshards.reading import loader
    from tfshards.reading.cachespace import LIMIT_ENV

    steps = manifest.records // batch
    model = _model(train_size, len(manifest.labels)) if train_size else None
    os.environ.pop(LIMIT_ENV, None)
    if limit is not None:
        os.environ[LIMIT_ENV] = str(limit)
    cache_dir = tempfile.mkdtemp(prefix="cachelimit-")
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.wait(0.001):
            peak[0] = max(peak[0], _dir_bytes(cache_dir))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        cpu, start = tree_cpu_seconds(), time.perf_counter()
        ds = loader.make_dataset(
            manifest.shards,
            manifest,
            batch_size=batch,
            training=True,
            cache_dir=cache_dir,
            storage_options=options,
            image_size=(train_size, train_size) if train_size else None,
        )
        if model is not None:  # fit lets its iterator go before it returns (see below)
            model.fit(ds, epochs=EPOCHS, steps_per_epoch=steps, verbose=0)
            seconds, cpu = time.perf_counter() - start, tree_cpu_seconds() - cpu
        else:
            batches = iter(ds.take(EPOCHS * steps))
            for _ in batches:
                pass
            # Timed to the last batch: letting the iterator go waits for the read a
            # window ahead.
            seconds, cpu = time.perf_counter() - start, tree_cpu_seconds() - cpu
            del batches
    finally:
        stop.set()
        sampler.join()
        os.environ.pop(LIMIT_ENV, None)
        shutil.rmtree(cache_dir, ignore_errors=True)
    return Run(seconds, cpu, peak[0])
