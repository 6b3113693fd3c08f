"""Feed Keras from raw files before any shards exist: a listing, a per-file function, tf.data.

``tf.data.Dataset.from_generator`` + ``map(tf.py_function, num_parallel_calls)``
looks parallel but runs every call under the GIL: for Python or numpy/PIL work
it was 0.68-0.84x of a plain serial generator, and it paid only for functions
that wait (FACTS.md). So :func:`from_files` runs the function where it can run
in parallel, chosen by ``mode``:

========== ================================================ =========================
mode       how                                              for
========== ================================================ =========================
processes  a process pool (forkserver: a parent that has    Python/numpy/PIL work
           loaded TensorFlow is never forked) maps ``fn``   that holds the GIL
           over chunks of files; results in order feed
           ``from_generator``
threads    a private thread pool maps ``fn`` over files;    ``fn`` that waits: network,
           results in order feed ``from_generator``         slow disks, sleeps
graph      ``fn`` is TensorFlow ops on ``(path, label)``    ``tf.io.read_file`` + ``tf.image``
           tensors: a plain ``tf.data`` map, AUTOTUNE       (no Python at all; fastest)
serial     ``fn`` inside the generator, one file at a time  a baseline, debugging
========== ================================================ =========================

``auto`` picks ``graph`` for a ``tf.function``, else ``processes`` when ``fn``
can be pickled (a module-level function) and the files are not in the
per-process ``memory://`` store, else ``threads``. Decoding and augmenting
images in Python is the common case and is CPU-bound, and a process pool is
the only one of these that uses more than one core for it; a waiting function
should ask for ``threads``.

``from_generator`` itself costs 0.1-0.5 ms per element it yields here, more
than many functions: when every output has a fixed shape the Python modes
stack elements (a batch, or ``CHUNK_ITEMS`` then ``unbatch`` in TensorFlow) and
yield one array per output per stack. On a 2 ms wait, ``threads`` ran 13-16x a
serial ``from_generator``; on ~0.5 ms of pure Python, ``processes`` spent
0.8-1.0 s of CPU (parent and workers) where the serial generator spent 1.0-1.3
s, i.e. ~2x on an idle 2-core machine.

Process pools are shared by every dataset of the process (one per worker
count) and started when a dataset is built, so only the first dataset pays the
start. ``forkserver`` imports your ``__main__`` once in its server (seconds if
that script imports TensorFlow at the top; keep ``fn`` in a light module and
import TensorFlow under ``if __name__ == "__main__"`` to avoid it).

Every element ``fn`` returns is checked against ``output_signature`` (same
structure, same dtype kind, same shape where declared) in the worker, so a
mismatch is an :class:`~tfshards.errors.InputError` naming the file, not a
nameless TensorFlow error. In the Python modes the element order is the file
order (or a seeded shuffle of it, new each epoch), whatever the parallelism.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import hashlib
import json
import multiprocessing
import os
import pickle
import random
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from tfshards import storage
from tfshards.errors import ConfigError, InputError
from tfshards.listing import Listing
from tfshards.loader import choose_val

if TYPE_CHECKING:
    import tensorflow as tf

MODES = ("auto", "serial", "threads", "processes", "graph")
DEFAULT_THREADS = 32  # 16 calls + 16 threads gave 5.8x on a 2 ms wait (FACTS.md); more waits more
CHUNK_ITEMS = 64  # elements per task / per yield when not batching: amortizes IPC and tf.data
AHEAD = 4  # tasks in flight per worker: a worker the OS pauses does not stall the others

Item = tuple[str, int]  # (path or URL of a file, label index)


# ----------------------------------------------------------------------------- split


@dataclass(frozen=True)
class FileSplit:
    """Train and validation files, chosen by :func:`split_files`."""

    train: Listing
    val: Listing
    seed: int
    val_fraction: float
    effective_val_fraction: float

    def to_json(self) -> bytes:
        """Counts and a digest of each side's paths: enough for lineage without a file list."""

        def side(listing: Listing) -> dict[str, Any]:
            digest = hashlib.sha256("\n".join(e.path for e in listing.entries).encode())
            return {"files": len(listing.entries), "paths_sha256": digest.hexdigest()}

        doc = {
            "effective_val_fraction": round(self.effective_val_fraction, 6),
            "root": self.train.root,
            "seed": self.seed,
            "train": side(self.train),
            "val": side(self.val),
            "val_fraction": self.val_fraction,
            "version": 1,
        }
        return (json.dumps(doc, sort_keys=True, indent=2) + "\n").encode()


def split_files(listing: Listing, val_fraction: float, seed: int = 0) -> FileSplit:
    """Split a listing's files into train and validation, like :func:`tfshards.loader.split`.

    The sorted paths are shuffled with ``random.Random(seed)`` and the first
    ``round(val_fraction * files)`` (at least one, at most all but one) go to
    validation. Both sides keep the listing's root and labels.
    """
    entries = listing.entries
    train, val, effective = choose_val(
        [e.path for e in entries],
        [1] * len(entries),
        val_fraction,
        seed,
        unit="file",
        counted="files",
    )

    def sub(indices: list[int]) -> Listing:
        return Listing(listing.root, listing.labels, tuple(entries[i] for i in indices))

    return FileSplit(sub(train), sub(val), seed, val_fraction, effective)


# ----------------------------------------------------------------------------- dataset


def from_files(
    listing: Listing,
    fn: Callable[..., Any],
    *,
    output_signature: Any,
    mode: str = "auto",
    num_parallel_calls: int | None = None,
    batch_size: int | None = None,
    drop_remainder: bool = False,
    shuffle: bool = False,
    seed: int = 0,
    deterministic: bool | None = None,
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of ``fn(path, label)`` over the files of ``listing``.

    Args:
        listing: the files (``listing.root`` joined with each entry's path is
            what ``fn`` gets) and their labels.
        fn: ``fn(path: str, label: int)`` returning numpy arrays / scalars in
            the structure of ``output_signature``; in ``graph`` mode a function
            of ``(path, label)`` tensors built from TensorFlow ops.
        output_signature: ``tf.TensorSpec`` (or a tuple/dict of them) of one
            element; ``None`` dimensions accept any size.
        mode: ``auto``, ``processes``, ``threads``, ``graph`` or ``serial``
            (see the module notes).
        num_parallel_calls: processes (default: usable cores), threads
            (default ``DEFAULT_THREADS``) or map calls (default AUTOTUNE).
        batch_size: batch this many elements (stacked in the workers in
            ``processes`` mode, so one array per batch crosses the process boundary).
        drop_remainder: drop a last partial batch (static batch dimension).
        shuffle: a new seeded file order each epoch.
        seed: seed of that order.
        deterministic: ``graph`` mode only; the Python modes always keep order.

    Raises:
        ConfigError: bad mode or options, or an ``output_signature`` that
            ``fn``'s graph cannot meet.
    """
    import tensorflow as tf

    if mode not in MODES:
        raise ConfigError(f"mode must be one of {MODES}, got {mode!r}")
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if num_parallel_calls is not None and num_parallel_calls < 1 and mode != "graph":
        raise ConfigError(f"num_parallel_calls must be >= 1, got {num_parallel_calls}")
    if not listing.entries:
        raise ConfigError(f"{listing.root}: the listing has no files")
    in_memory = storage.protocol(storage.open_url(listing.root)[0]) == "memory"
    mode = _resolve_mode(mode, fn, in_memory)
    items = [(storage.join(listing.root, e.path), e.label) for e in listing.entries]
    if mode == "graph":
        ds = _graph_dataset(
            tf, items, fn, output_signature, num_parallel_calls, shuffle, seed, deterministic
        )
        if batch_size is not None:
            ds = ds.batch(batch_size, drop_remainder=drop_remainder)
        return ds.prefetch(tf.data.AUTOTUNE)

    leaves = tuple(_leaf(tf, spec) for spec in tf.nest.flatten(output_signature))
    template = tf.nest.map_structure(lambda _: None, output_signature)
    runner = _Runner(mode, fn, leaves, num_parallel_calls)
    # from_generator costs ~0.1-0.5 ms per element it yields, far more than a cheap fn: with
    # fixed shapes, yield stacked chunks (a batch, or CHUNK_ITEMS then unbatch in TF).
    fixed = all(leaf.shape is not None and None not in leaf.shape for leaf in leaves)
    chunk = (batch_size or CHUNK_ITEMS) if fixed else None
    epochs = iter(range(1 << 62))

    def generate() -> Iterator[Any]:
        order = list(items)
        if shuffle:
            random.Random(f"{seed}/{next(epochs)}").shuffle(order)
        for leaves_out in runner.run(order, chunk):
            if chunk is not None and drop_remainder and len(leaves_out[0]) < chunk:
                return
            yield _pack(template, leaves_out)

    signature = output_signature
    if chunk is not None:
        dim = chunk if batch_size is not None and drop_remainder else None
        signature = tf.nest.map_structure(
            lambda s: tf.TensorSpec((dim, *s.shape), s.dtype, s.name), output_signature
        )
    ds = tf.data.Dataset.from_generator(generate, output_signature=signature)
    if chunk is not None and batch_size is None:
        ds = ds.unbatch()
    elif chunk is None and batch_size is not None:
        ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    return ds.prefetch(tf.data.AUTOTUNE)


def _resolve_mode(mode: str, fn: Callable[..., Any], in_memory: bool) -> str:
    if mode == "auto":
        if hasattr(fn, "get_concrete_function"):
            return "graph"
        return "processes" if _picklable(fn) and not in_memory else "threads"
    if mode == "processes":
        if in_memory:
            raise ConfigError(
                "memory:// lives in one process, so worker processes cannot read its files; "
                "use mode 'threads'"
            )
        if not _picklable(fn):
            raise ConfigError(
                f"mode 'processes' needs a function that pickles (defined at module level, "
                f"not a lambda or closure); {fn!r} does not"
            )
    return mode


def _picklable(fn: Callable[..., Any]) -> bool:
    try:
        pickle.dumps(fn)
    except (pickle.PicklingError, TypeError, AttributeError):
        return False
    return True


# ----------------------------------------------------------------------------- checks


class Leaf(NamedTuple):
    """One declared output: numpy dtype (None for strings) and shape (None = any size)."""

    dtype: str | None
    shape: tuple[int | None, ...] | None
    name: str


def _leaf(tf: Any, spec: Any) -> Leaf:
    if not isinstance(spec, tf.TensorSpec):
        raise ConfigError(f"output_signature: expected tf.TensorSpec leaves, found {spec!r}")
    dims = None if spec.shape.rank is None else tuple(spec.shape.as_list())
    dtype = None if spec.dtype == tf.string else np.dtype(spec.dtype.as_numpy_dtype).str
    return Leaf(dtype, dims, spec.name or "")


def _flatten(value: Any) -> list[Any]:
    """Leaves in ``tf.nest`` order (dict values by sorted key), without TensorFlow."""
    if isinstance(value, Mapping):
        return [leaf for key in sorted(value) for leaf in _flatten(value[key])]
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _flatten(item)]
    return [value]


def _pack(template: Any, leaves: Sequence[Any]) -> Any:
    it = iter(leaves)

    def build(node: Any) -> Any:
        if isinstance(node, Mapping):
            built = {key: build(node[key]) for key in sorted(node)}
            return {key: built[key] for key in node}
        if isinstance(node, (tuple, list)):
            return type(node)(build(item) for item in node)
        return next(it)

    return build(template)


_KINDS = {"b": "biu", "i": "iu", "u": "iu", "f": "fiu", "c": "cfiu"}


def check_element(value: Any, leaves: Sequence[Leaf], path: str) -> list[np.ndarray[Any, Any]]:
    """Flatten ``value`` and check it against ``leaves``; returns arrays of the declared dtypes.

    Raises:
        InputError: naming ``path``, the output, what was declared and what was found.
    """
    found = _flatten(value)
    if len(found) != len(leaves):
        raise InputError(
            f"{path}: fn returned {len(found)} values, output_signature declares {len(leaves)}",
            path=path,
        )
    out = []
    for i, (raw, leaf) in enumerate(zip(found, leaves, strict=True)):
        array = np.asarray(raw)
        label = f"output {i}" + (f" ({leaf.name})" if leaf.name else "")
        if leaf.dtype is None:
            ok = array.dtype.kind in "SUO"
        else:
            want = np.dtype(leaf.dtype)
            ok = array.dtype.kind in _KINDS.get(want.kind, want.kind)
        shape_ok = leaf.shape is None or (
            array.ndim == len(leaf.shape)
            and all(d is None or d == n for d, n in zip(leaf.shape, array.shape, strict=True))
        )
        if not (ok and shape_ok):
            expected = "string" if leaf.dtype is None else np.dtype(leaf.dtype).name
            shape = "any shape" if leaf.shape is None else f"shape {list(leaf.shape)}"
            raise InputError(
                f"{path}: {label}: expected {expected} of {shape}, "
                f"found {array.dtype.name} of shape {list(array.shape)}",
                path=path,
                output=i,
            )
        out.append(array if leaf.dtype is None else array.astype(leaf.dtype, copy=False))
    return out


def apply_chunk(
    fn: Callable[..., Any], chunk: Sequence[Item], leaves: Sequence[Leaf], stack: bool
) -> list[Any]:
    """The unit of work in the pools: ``fn`` over a chunk, checked, optionally stacked."""
    elements = []
    for path, label in chunk:
        try:
            value = fn(path, label)
        except InputError:
            raise
        except Exception as exc:  # a user's function can raise anything; report which file
            raise InputError(
                f"{path}: {getattr(fn, '__name__', 'fn')} failed: {type(exc).__name__}: {exc}",
                path=path,
            ) from exc
        elements.append(check_element(value, leaves, path))
    if not stack:
        return elements
    return [[np.stack(column) for column in zip(*elements, strict=True)]]


# ----------------------------------------------------------------------------- pools


class _Runner:
    """Maps ``fn`` over items in order on a pool that lives as long as the dataset."""

    def __init__(
        self, mode: str, fn: Callable[..., Any], leaves: Sequence[Leaf], workers: int | None
    ) -> None:
        self.mode, self.fn, self.leaves = mode, fn, tuple(leaves)
        self.pool: cf.Executor | None = None
        if mode == "threads":
            self.workers = workers or DEFAULT_THREADS
            self.pool = cf.ThreadPoolExecutor(self.workers, thread_name_prefix="tfshards-files")
            weakref.finalize(self, self.pool.shutdown, wait=False, cancel_futures=True)
        elif mode == "processes":
            self.workers = workers or _cpu_count()
            self.pool = _process_pool(self.workers)
            for _ in range(self.workers):  # start the workers and import fn's module now
                self.pool.submit(_warm, fn)
        else:
            self.workers = 1

    def run(self, items: Sequence[Item], stack: int | None) -> Iterator[list[Any]]:
        """Flat leaves of each element in order, or of each ``stack`` elements stacked."""
        if self.mode == "threads":
            # One file per task keeps every thread busy; stacking happens here, in order.
            results = self._ordered([items[i : i + 1] for i in range(len(items))], False)
            if stack is None:
                yield from results
            else:
                yield from _stacked(results, stack)
            return
        size = stack or CHUNK_ITEMS
        chunks = [items[i : i + size] for i in range(0, len(items), size)]
        if self.pool is None:
            for part in chunks:
                yield from apply_chunk(self.fn, part, self.leaves, stack is not None)
            return
        yield from self._ordered(chunks, stack is not None)

    def _ordered(self, chunks: Sequence[Sequence[Item]], stack: bool) -> Iterator[list[Any]]:
        if self.pool is None:
            raise RuntimeError("no pool")  # pragma: no cover - run() handles serial mode
        pending: collections.deque[tuple[str, cf.Future[list[Any]]]] = collections.deque()
        try:
            for part in chunks:
                future = self.pool.submit(apply_chunk, self.fn, part, self.leaves, stack)
                pending.append((part[0][0], future))
                if len(pending) >= self.workers * AHEAD:
                    yield from self._result(*pending.popleft())
            while pending:
                yield from self._result(*pending.popleft())
        finally:
            for _, future in pending:
                future.cancel()

    def _result(self, first: str, future: cf.Future[list[Any]]) -> list[Any]:
        try:
            return future.result()
        except BrokenProcessPool as exc:
            with _POOLS_LOCK:  # the next dataset starts a fresh pool
                if _POOLS.get(self.workers) is self.pool:
                    del _POOLS[self.workers]
            raise InputError(
                f"{first}: a worker process died (killed by a signal or out of memory) "
                "while running fn on a chunk of files starting here",
                path=first,
            ) from exc


_POOLS: dict[int, cf.ProcessPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _process_pool(workers: int) -> cf.ProcessPoolExecutor:
    """One pool per worker count, shared by every dataset: workers start once per process.

    ``forkserver``: the workers are forked from a clean server process, never
    from this one (which has TensorFlow's threads running).
    """
    with _POOLS_LOCK:
        pool = _POOLS.get(workers)
        if pool is None:
            context = multiprocessing.get_context("forkserver")
            pool = _POOLS[workers] = cf.ProcessPoolExecutor(workers, mp_context=context)
        return pool


def _stacked(elements: Iterator[list[Any]], size: int) -> Iterator[list[Any]]:
    group: list[list[Any]] = []
    for element in elements:
        group.append(element)
        if len(group) == size:
            yield [np.stack(column) for column in zip(*group, strict=True)]
            group = []
    if group:
        yield [np.stack(column) for column in zip(*group, strict=True)]


def _warm(fn: Callable[..., Any]) -> None:
    """Nothing: receiving ``fn`` imports its module in the worker, before the first epoch."""


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# ----------------------------------------------------------------------------- graph


def _graph_dataset(
    tf: Any,
    items: Sequence[Item],
    fn: Callable[..., Any],
    output_signature: Any,
    num_parallel_calls: int | None,
    shuffle: bool,
    seed: int,
    deterministic: bool | None,
) -> Any:
    paths = [p for p, _ in items]
    labels = np.array([label for _, label in items], dtype=np.int64)
    ds = tf.data.Dataset.from_tensor_slices((paths, labels))
    if shuffle:
        ds = ds.shuffle(len(items), seed=seed, reshuffle_each_iteration=True)
    specs = tf.nest.flatten(output_signature)
    # Trace fn once on its own to compare what it makes with what was declared, so a
    # mismatch is a ConfigError here, not an error wrapped by autograph's tracing.
    made = ds.map(fn).element_spec
    try:
        tf.nest.assert_same_structure(made, output_signature)
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"fn's output does not have output_signature's structure: {exc}"
        ) from None
    for i, (got, spec) in enumerate(zip(tf.nest.flatten(made), specs, strict=True)):
        if got.dtype != spec.dtype or not got.shape.is_compatible_with(spec.shape):
            raise ConfigError(
                f"output {i}: output_signature declares {spec.dtype.name} of shape {spec.shape}, "
                f"fn makes {got.dtype.name} of shape {got.shape}"
            )

    def checked(path: Any, label: Any) -> Any:
        out = []
        outputs = tf.nest.flatten(fn(path, label))
        for i, (tensor, spec) in enumerate(zip(outputs, specs, strict=True)):
            if spec.shape.rank is not None and not tensor.shape.is_fully_defined():
                want = [-1 if d is None else d for d in spec.shape.as_list()]
                ok = tf.reduce_all((tf.shape(tensor) == want) | (tf.constant(want) < 0))
                check = tf.debugging.Assert(
                    ok, [path, f"output {i}: expected shape {want}, found", tf.shape(tensor)]
                )
                with tf.control_dependencies([check]):
                    tensor = tf.identity(tensor)
            out.append(tf.ensure_shape(tensor, spec.shape))
        return tf.nest.pack_sequence_as(output_signature, out)

    calls = tf.data.AUTOTUNE if num_parallel_calls is None else num_parallel_calls
    return ds.map(checked, num_parallel_calls=calls, deterministic=deterministic)
