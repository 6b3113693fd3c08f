"""The benchmark suite: data, sections, result document (``bench.suite.run`` is its CLI)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
from functools import partial
from typing import Any

from bench.common.data import (
    LARGE,
    MEDIUM,
    SMALL,
    THUMB,
    TINY,
    DataSet,
    ensure,
    listing_of,
    subset,
)
from bench.suite import bound as bounds
from bench.suite import checkers, growth, lookup, memory, readers, report, resume, startup, writers
from bench.suite.rounds import Contender, Epochs, compare, cpu_count, row
from tfshards.listing.listing import Listing
from tfshards.shardset.layout import MANIFEST_NAME
from tfshards.shardset.manifest import Manifest
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

WORKERS = 2  # tfshards' pool size in every job; the machine the README quotes has 2 cores


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    model = "unknown"
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    import psutil  # type: ignore[import-untyped]

    return {
        "cpus": cpu_count(),
        "cpu_model": model,
        "memory_gib": psutil.virtual_memory().total / 2**30,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "tensorflow_datasets": tfds.__version__,
        "load_before": _load(),
    }


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


class Bench:
    """Runs the selected sections over the data sets, collecting result rows."""

    def __init__(
        self, reps: int, workroot: str, costs: dict[str, dict[str, float]], warmup: bool = True
    ) -> None:
        self.reps = reps
        self.warmup = warmup
        self.workroot = workroot
        self.costs = costs
        self.rows: list[dict[str, Any]] = []
        self.cores = cpu_count()

    def bound(self, data: str, job: str) -> float | None:
        if data not in self.costs:
            return None
        return bounds.bound(self.costs[data], BOUND_PIECES[job], self.cores)

    def job(
        self,
        group: str,
        data: str,
        contenders: list[Contender],
        bound_rps: float | None,
    ) -> None:
        log(f"{group} / {data}:")
        compare(contenders, self.reps, self.workroot, log, self.warmup)
        base = contenders[0]
        for c in contenders:
            self.rows.append(row(group, data, c, None if c is base else base, bound_rps))

    def write(self, name: str, listing: Listing) -> None:
        self.job(
            "write",
            name,
            [
                Contender("naive loop (1 process)", partial(writers.naive_write, listing)),
                Contender(
                    "seed recipe (Process start+join)", partial(writers.seed_recipe_write, listing)
                ),
                Contender("tensorflow-datasets build", partial(writers.tfds_write, listing)),
                Contender(
                    "tfshards (1 process)", lambda out: writers.tfshards_write(listing, out, 1)
                ),
                Contender(
                    f"tfshards ({WORKERS} threads)",
                    lambda out: writers.tfshards_write(listing, out, WORKERS, "thread"),
                    note="what auto picks when tfshards.format._native is built",
                ),
                Contender(
                    f"tfshards ({WORKERS} processes)",
                    lambda out: writers.tfshards_write(listing, out, WORKERS, "process"),
                    note="starts its process pool in every run",
                ),
            ],
            self.bound(name, "write"),
        )

    def image_checks(self, name: str, listing: Listing) -> None:
        """The write with its image checks on against off, then validate with the
        near-duplicate check (which hashes every image) against without."""
        self.job(
            "image checks",
            name,
            [
                Contender(
                    f"tfshards ({WORKERS} threads)",
                    lambda out: writers.tfshards_write(listing, out, WORKERS, "thread"),
                ),
                Contender(
                    f"tfshards ({WORKERS} threads), exif warn",
                    lambda out: writers.tfshards_write(
                        listing, out, WORKERS, "thread", exif="warn"
                    ),
                    note="orientations counted in the C pass of the image statistics",
                ),
            ],
            None,
        )
        url, _, _ = _prepare_shards(listing, self.workroot, False)
        warm = tempfile.mkdtemp(dir=self.workroot, prefix="phash-")
        self.job(
            "near-duplicates",
            name,
            [
                Contender(
                    f"tfshards validate ({WORKERS} processes)",
                    lambda _: checkers.tfshards_validate(url, WORKERS),
                ),
                Contender(
                    "near_duplicates true, empty cache",
                    lambda out: checkers.tfshards_validate(url, WORKERS, cache=out),
                    note="each image decoded at 1/2..1/8 scale and hashed (format.phash)",
                ),
                Contender(
                    "near_duplicates true, cache filled",
                    lambda _: checkers.tfshards_validate(url, WORKERS, cache=warm),
                    note="each shard's hashes read back by its sha256 (a grown version's "
                    "kept shards)",
                ),
            ],
            None,
        )

    def validate(self, name: str, manifest_url: str, manifest: Manifest) -> None:
        self.job(
            "validate",
            name,
            [
                Contender(
                    "eager TFRecordDataset + Example.FromString",
                    lambda _: checkers.eager_validate(manifest),
                ),
                Contender(
                    "tfshards validate (1 process)",
                    lambda _: checkers.tfshards_validate(manifest_url, 1),
                    note="also checks file sha256 and every record against the schema",
                ),
                Contender(
                    f"tfshards validate ({WORKERS} processes)",
                    lambda _: checkers.tfshards_validate(manifest_url, WORKERS),
                    note="starts its process pool in every run",
                ),
                Contender(
                    f"tfshards validate ({WORKERS} threads)",
                    lambda _: checkers.tfshards_validate(manifest_url, WORKERS, "thread"),
                    note="what auto picks when tfshards.format._native is built",
                ),
            ],
            self.bound(name, "validate"),
        )

    def read(self, name: str, listing: Listing, manifest: Manifest, tfds_dir: str) -> None:
        payload = listing.total_bytes
        self.job(
            "read",
            name,
            [
                Contender(
                    "seed reader (parse_single_example)",
                    Epochs(partial(readers.seed_read, manifest), payload),
                ),
                Contender(
                    "tensorflow-datasets as_dataset",
                    Epochs(partial(readers.tfds_read, listing, tfds_dir), payload),
                ),
                Contender(
                    "tfshards make_dataset",
                    Epochs(partial(readers.tfshards_read, manifest), payload),
                ),
            ],
            self.bound(name, "read"),
        )

    def read_resized(self, name: str, listing: Listing, manifest: Manifest) -> None:
        """The large set read at each side of ``readers.RESIZED``, and pre-resized copies."""
        payload = listing.total_bytes
        for side in readers.RESIZED:
            written = {
                fmt: _resized_shards(listing, self.workroot, side, fmt) for fmt in RESIZE_FORMATS
            }
            self.job(
                "read resized",
                f"{name} -> {side} px",
                [
                    Contender(
                        "usual reader (parse_single_example, decode_jpeg, resize)",
                        Epochs(partial(readers.seed_read_resized, manifest, side), payload),
                    ),
                    Contender(
                        f"tfshards make_dataset (shards {manifest.bytes / 1e6:.1f} MB)",
                        Epochs(partial(readers.tfshards_read_resized, manifest, side), payload),
                        note="scaled JPEG decode when the target is at most half the image",
                    ),
                    Contender(
                        "tfshards make_dataset, scaled_decode=False",
                        Epochs(
                            partial(readers.tfshards_read_resized, manifest, side, False), payload
                        ),
                    ),
                    *(
                        Contender(
                            f"tfshards make_dataset, written with resize {side} {fmt} "
                            f"(shards {m.bytes / 1e6:.1f} MB)",
                            Epochs(partial(readers.tfshards_read_resized, m, side), payload),
                            note="decoded at the stored size, no resize",
                        )
                        for fmt, m in written.items()
                    ),
                ],
                None,
            )

    def read_sizes(self, listings: dict[int, Listing]) -> None:
        """Each source side of ``readers.SIZES`` read at its target side: usual reader, tfshards."""
        for source, listing in listings.items():
            side = readers.SIZES[source]
            _, manifest, _ = _prepare_shards(listing, self.workroot, False)
            payload = listing.total_bytes
            self.job(
                "read by size",
                f"{source} px -> {side} px ({len(listing.entries):,} JPEGs)",
                [
                    Contender(
                        "usual reader (parse_single_example, decode_jpeg, resize)",
                        Epochs(partial(readers.seed_read_resized, manifest, side), payload),
                    ),
                    Contender(
                        "tfshards make_dataset",
                        Epochs(partial(readers.tfshards_read_resized, manifest, side), payload),
                        note="the loader's decode plan",
                    ),
                    *(
                        Contender(
                            f"tfshards make_dataset, {options}",
                            Epochs(
                                partial(readers.tfshards_read_resized, manifest, side, *args),
                                payload,
                            ),
                            note=note,
                        )
                        for options, args, note in FORCED_PATHS
                    ),
                ],
                None,
            )


# The two decode paths forced, beside the plan: options as named, tfshards_read_resized's
# (scaled, per_record), what the path does.
FORCED_PATHS = (
    ("per_record=True", (True, True), "parsed and decoded record by record"),
    (
        "per_record=False, scaled_decode=False",
        (False, False),
        "parsed and decoded a batch at a time",
    ),
)


def sized_sets(listings: dict[str, Listing], scale: float, data_dir: str) -> dict[int, Listing]:
    """The listing of each source side of ``readers.SIZES``, generated where missing.

    Tiny, thumb and medium whole; every 4th image of small and large (5,000 and 500 at scale 1).
    """
    sized: dict[int, Listing] = {}
    for data, every in ((TINY, 1), (THUMB, 1), (SMALL, 4), (MEDIUM, 1), (LARGE, 4)):
        if data.name in listings:
            listing = listings[data.name]
        else:
            root, seconds = ensure(data.scaled(scale), data_dir)
            if seconds:
                log(f"generated {data.scaled(scale).count} {data.size}px JPEGs ({seconds:.0f} s)")
            listing = listing_of(root)
        sized[data.size] = subset(listing, every)
    return sized


RESIZE_FORMATS = ("jpeg", "raw")  # write.resize_format values the bench reads back


def _resized_shards(listing: Listing, workroot: str, side: int, fmt: str) -> Manifest:
    """``listing`` written already resized to ``side`` in ``fmt`` (untimed)."""
    shards_dir = tempfile.mkdtemp(dir=workroot, prefix=f"shards-{side}-{fmt}-")
    config = WriteConfig(
        out=shards_dir, workers=WORKERS, executor="process", resize=side, resize_format=fmt
    )
    return write(config, listing, progress=False).manifest


BOUND_PIECES = {"write": bounds.WRITE, "validate": bounds.VALIDATE, "read": bounds.READ}


def _prepare_shards(listing: Listing, workroot: str, tfds: bool) -> tuple[str, Manifest, str]:
    """tfshards shards (and, for read, a tfds build) of ``listing``, untimed."""
    from bench.suite.tfds_builder import build

    shards_dir = tempfile.mkdtemp(dir=workroot, prefix="shards-")
    config = WriteConfig(out=shards_dir, workers=WORKERS, executor="process")
    manifest = write(config, listing, progress=False).manifest
    tfds_dir = tempfile.mkdtemp(dir=workroot, prefix="tfds-")
    if tfds:
        build(listing, tfds_dir, writers.NUM_SHARDS)
    return os.path.join(manifest.root, MANIFEST_NAME), manifest, tfds_dir


def run(
    out: str,
    only: tuple[str, ...],
    reps: int,
    scale: float,
    data_dir: str,
    command: str,
    quick: bool = False,
) -> dict[str, Any]:
    """Run the sections in ``only``; returns the result document (also written to ``out``).

    ``quick``: a smoke run. No warm-up run where a section does without one, the
    start and show sections take ``reps`` rounds instead of at least 5, and the
    bound's pieces are timed over one pass of their files.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    info = machine()
    sets: list[DataSet] = [SMALL.scaled(scale), LARGE.scaled(scale)]
    listings: dict[str, Listing] = {}
    for d in sets:
        root, seconds = ensure(d, data_dir)
        if seconds:
            log(f"generated {d.count} {d.size}px JPEGs in {root} ({seconds:.0f} s)")
        listings[d.name] = listing_of(root)
    workroot = tempfile.mkdtemp(dir=data_dir, prefix="work-")
    try:
        costs: dict[str, dict[str, float]] = {}
        if set(only) & {"bound", "write", "validate", "read", "generator"}:
            for name, listing in listings.items():
                log(f"bound / {name}: timing the unavoidable steps")
                costs[name] = bounds.costs(listing, quick=quick)
        bench = Bench(reps, workroot, costs, warmup=not quick)
        least = reps if quick else max(reps, 5)  # fast commands: medians of at least 5
        if "bound" in only:
            for name in listings:
                bench.rows += bounds.as_rows(name, costs[name])
        for name, listing in listings.items():
            if "write" in only:
                bench.write(name, listing)
            if "imagecheck" in only and name == SMALL.name:
                bench.image_checks(name, listing)
            if "validate" in only or "read" in only:
                url, manifest, tfds_dir = _prepare_shards(listing, workroot, "read" in only)
                if "validate" in only:
                    bench.validate(name, url, manifest)
                if "read" in only:
                    bench.read(name, listing, manifest, tfds_dir)
                    if name == LARGE.name:
                        bench.read_resized(name, listing, manifest)
        if "sizes" in only:
            bench.read_sizes(sized_sets(listings, scale, data_dir))
        if "generator" in only:
            from bench.suite import generators

            bench.rows += generators.compare_all(
                listings["small"], reps, scale, workroot, log, not quick
            )
        if "memory" in only:
            small = listings["small"]
            sizes = {f"{len(subset(small, 10).entries):,} files": subset(small, 10)}
            sizes[f"{len(small.entries):,} files"] = small
            bench.rows += memory.compare(sizes, list(memory.KINDS), reps, workroot, log, not quick)
        if "grow" in only:
            log("grow / small: a write from scratch, then versions grown one from another")
            small_root = listings[SMALL.name].root
            bench.rows += growth.compare(SMALL.scaled(scale), small_root, reps, workroot, log)
        if "start" in only:
            bench.rows += startup.compare(least, log, not quick)
        if "resume" in only:
            log("resume / small: the first batch at 80% of an epoch, and at its start")
            _, manifest, _ = _prepare_shards(listings[SMALL.name], workroot, False)
            bench.rows += resume.compare(manifest, reps, log)
        if "show" in only:
            records = max(100, round(lookup.RECORDS * scale))
            bench.rows += lookup.compare(records, least, workroot, log, not quick)
        if "cachelimit" in only:
            from bench.suite import cachelimit

            log("cachelimit / 3 epochs from moto's S3, the cache limited to 20% and unlimited")
            root, _ = ensure(cachelimit.data_set(scale), data_dir)
            shards = cachelimit.QUICK_SHARDS if quick else cachelimit.SHARDS
            bench.rows += cachelimit.compare(
                listing_of(root), reps, log, warmup=not quick, shards=shards
            )
    finally:
        shutil.rmtree(workroot, ignore_errors=True)
    info["load_after"] = _load()
    doc = {
        "version": 1,
        "command": command,
        "scale": scale,
        "reps": reps,
        "quick": quick,
        "sections": list(only),
        "machine": info,
        "data": {
            d.name: {
                "count": d.count,
                "size": d.size,
                "mean_bytes": listings[d.name].total_bytes / len(listings[d.name].entries),
            }
            for d in sets
        },
        "bound_pieces": {job: list(p) for job, p in BOUND_PIECES.items()},
        "bounds": {name: {job: bench.bound(name, job) for job in BOUND_PIECES} for name in costs},
        "rows": bench.rows,
    }
    _save(doc, out)
    return doc


def _save(doc: dict[str, Any], out: str) -> None:
    """``latest.json`` and ``latest.md`` in ``out``, each written to a temp file then renamed."""
    os.makedirs(out, exist_ok=True)
    texts = {
        "latest.json": json.dumps(doc, indent=2, sort_keys=True) + "\n",
        "latest.md": report.render(doc),
    }
    for name, text in texts.items():
        path = os.path.join(out, name)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
