"""Feeding tf.data from a per-item Python function: serial, the py_function recipe, tfshards.

Three kinds of per-item work (in :mod:`bench.suite.items`), each a function of a file path:

* ``pil``: decode the JPEG with Pillow and resize it (C code that releases the GIL);
* ``python``: ~0.5 ms of pure-Python arithmetic (holds the GIL throughout);
* ``sleep``: ``time.sleep(0.002)``, standing for a wait on storage or a service.

Every contender yields the same elements in batches of ``BATCH`` (tfshards
stacks them in its workers with ``batch_size``, the others call ``.batch``).
Each dataset is built once, by the warm-up run, which also starts any pool;
the timed runs are the epochs after it, as a training loop sees them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from bench.suite.items import RESIZE, pil_resize, python_loop, sleep_io, tf_resize
from bench.suite.rounds import Contender, Epochs, compare, cpu_count, row
from tfshards.listing.listing import Listing

BATCH = 64
ITEMS = {"pil": 4000, "python": 1000, "sleep": 500}  # at scale 1: ~1-2 s serial each
FUNCTIONS: dict[str, tuple[Callable[..., Any], tuple[int, ...], str]] = {
    "pil": (pil_resize, (*RESIZE, 3), "uint8"),
    "python": (python_loop, (1,), "int64"),
    "sleep": (sleep_io, (1,), "int64"),
}
GRAPH = "tfshards from_files, graph (same work in TF ops)"
TITLES = {
    "pil": "PIL decode+resize",
    "python": "pure-Python loop",
    "sleep": "sleep 2 ms (I/O)",
}


def _spec(kind: str) -> Any:
    import tensorflow as tf

    _, shape, dtype = FUNCTIONS[kind]
    return tf.TensorSpec(shape, getattr(tf, dtype))


def serial(kind: str, paths: Sequence[str]) -> Any:
    """``Dataset.from_generator`` over the items, the function called inline."""
    import tensorflow as tf

    fn = FUNCTIONS[kind][0]
    dataset = tf.data.Dataset.from_generator(
        lambda: (fn(p) for p in paths), output_signature=_spec(kind)
    )
    return dataset.batch(BATCH)


def seed_recipe(kind: str, paths: Sequence[str]) -> Any:
    """Indices from a generator, then ``map(tf.py_function(fn), num_parallel_calls=AUTOTUNE)``."""
    import tensorflow as tf

    fn = FUNCTIONS[kind][0]
    spec = _spec(kind)

    def call(i: Any) -> Any:
        return fn(paths[int(i)])

    def apply(i: Any) -> Any:
        out = tf.py_function(call, [i], spec.dtype)
        out.set_shape(spec.shape)
        return out

    indices = tf.data.Dataset.from_generator(
        lambda: iter(range(len(paths))), output_signature=tf.TensorSpec((), tf.int64)
    )
    return indices.map(apply, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH)


def tfshards_from_files(kind: str, mode: str, listing: Listing) -> Any:
    """``tfshards.reading.generator.from_files`` in ``mode`` (``graph`` runs the work as TF ops)."""
    from tfshards.reading.generator import from_files

    fn = tf_resize if mode == "graph" else FUNCTIONS[kind][0]
    return from_files(listing, fn, output_signature=_spec(kind), mode=mode, batch_size=BATCH)


def cost_per_item(kind: str, paths: Sequence[str]) -> float:
    """CPU seconds per item of the function alone (plain loop, no TensorFlow)."""
    fn = FUNCTIONS[kind][0]
    sample = paths[: max(1, min(len(paths), 200))]
    fn(sample[0])  # imports, first-call costs
    t0 = time.process_time()
    for p in sample:
        fn(p)
    return (time.process_time() - t0) / len(sample)


def contenders(kind: str, part: Listing) -> list[Contender]:
    """Serial (baseline), the py_function recipe, and tfshards' modes that can run ``kind``."""
    paths = [os.path.join(part.root, e.path) for e in part.entries]
    payload = part.total_bytes
    out = [
        Contender("serial from_generator", Epochs(lambda: serial(kind, paths), payload)),
        Contender(
            "seed recipe (py_function, AUTOTUNE)",
            Epochs(lambda: seed_recipe(kind, paths), payload),
        ),
    ]
    modes = {
        "process": "tfshards from_files, processes",
        "thread": "tfshards from_files, threads",
    }
    if kind == "pil":  # graph mode needs the work written as TensorFlow ops
        modes["graph"] = GRAPH
    for mode, name in modes.items():
        out.append(Contender(name, Epochs(partial(tfshards_from_files, kind, mode, part), payload)))
    return out


def compare_all(
    listing: Listing,
    reps: int,
    scale: float,
    workroot: str,
    log: Callable[[str], None],
    warmup: bool = True,
) -> list[dict[str, Any]]:
    """One job per kind of function; the bound is ``cores / CPU per item`` (none for sleep)."""
    rows = []
    cores = cpu_count()
    for kind, items in ITEMS.items():
        n = min(len(listing.entries), max(32, round(items * scale)))
        step = max(1, len(listing.entries) // n)
        part = Listing(listing.root, listing.labels, listing.entries[::step][:n])
        cost = cost_per_item(kind, [os.path.join(part.root, e.path) for e in part.entries])
        bound_rps = None if kind == "sleep" else cores / cost
        log(f"generator / {TITLES[kind]}: {n} items, {cost * 1e6:.0f} us CPU per item")
        group = contenders(kind, part)
        compare(group, reps, workroot, log, warmup)
        for c in group:
            base = None if c is group[0] else group[0]
            extra = {"us_per_item": cost * 1e6}
            # graph mode does the work in TF ops, not in the timed Python function: no bound
            own_bound = None if c.name == GRAPH else bound_rps
            rows.append(row("generator", TITLES[kind], c, base, own_bound, extra))
    return rows
