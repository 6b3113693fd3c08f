"""Feed Keras from raw files before any shards exist: a listing, a per-file function, tf.data.

``tf.data.Dataset.from_generator`` + ``map(tf.py_function, num_parallel_calls)``
looks parallel but runs every call under the GIL: for Python or numpy/PIL work
it was 0.68-0.84x of a plain serial generator, and it paid only for functions
that wait (1.6x with AUTOTUNE on a 2 ms sleep; 2 cores). So :func:`from_files`
runs the function where it can run in parallel, chosen by ``mode``:

========== ================================================ =========================
mode       how                                              for
========== ================================================ =========================
process    a process pool (forkserver: a parent that has    Python/numpy/PIL work
           loaded TensorFlow is never forked) maps ``fn``   that holds the GIL
           over chunks of files; results in order feed
           ``from_generator``
thread     a private thread pool maps ``fn`` over files;    ``fn`` that waits: network,
           results in order feed ``from_generator``         slow disks, sleeps
graph      ``fn`` is TensorFlow ops on ``(path, label)``    ``tf.io.read_file`` + ``tf.image``
           tensors: a plain ``tf.data`` map, AUTOTUNE       (no Python at all; fastest)
serial     ``fn`` inside the generator, one file at a time  a baseline, debugging
========== ================================================ =========================

``auto`` picks ``graph`` for a ``tf.function``, else ``process`` when ``fn``
can be pickled (a module-level function) and the files are not in the
per-process ``memory://`` store, else ``thread``. Decoding and augmenting
images in Python is the common case and is CPU-bound, and a process pool is
the only one of these that uses more than one core for it; a waiting function
should ask for ``thread``. The names are the executor names of
:mod:`tfshards.run.executor`; ``threads`` and ``processes`` still work, with a
``DeprecationWarning``.

``from_generator`` itself costs 0.1-0.5 ms per element it yields here, more
than many functions: when every output has a fixed shape the Python modes
stack elements (a batch, or ``CHUNK_ITEMS`` then ``unbatch`` in TensorFlow) and
yield one array per output per stack. On a 2 ms wait, ``thread`` ran 13-16x a
serial ``from_generator``; on ~0.5 ms of pure Python, ``process`` spent
0.8-1.0 s of CPU (parent and workers) where the serial generator spent 1.0-1.3
s, i.e. ~2x on an idle 2-core machine.

Process pools are shared by every dataset of the process (one per worker
count) and started when a dataset is built, so only the first dataset pays the
start. ``forkserver`` imports your ``__main__`` once in its server (seconds if
that script imports TensorFlow at the top; keep ``fn`` in a light module and
import TensorFlow under ``if __name__ == "__main__"`` to avoid it).

Every element ``fn`` returns is checked against ``output_signature`` (same
structure, same dtype kind, same shape where declared; integers within the
declared type's range) in the worker, so a mismatch, or an exception ``fn``
raises, is an :class:`~tfshards.errors.InputError` naming the file. TensorFlow
hands it on as an ``OpError`` whose message holds the Python traceback; inside
``with file_errors():`` it is raised as the ``InputError`` itself. In the Python
modes the element order is the file order (or a seeded shuffle of it, new each
epoch), whatever the parallelism.
"""

from __future__ import annotations

import contextlib
import pickle
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tfshards import storage
from tfshards.errors import ConfigError, InputError
from tfshards.listing.listing import Listing
from tfshards.processes import cpu_count
from tfshards.reading.pools import (
    CHUNK_ITEMS,
    Item,
    Leaf,
    Runner,
    chunk_items,
)
from tfshards.reading.raised import Raised
from tfshards.run.executor import canonical

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = [
    "MODES",
    "file_errors",
    "from_files",
]

_raised: Raised[InputError] = Raised()  # for file_errors to raise again as they were

MODES = ("auto", "serial", "thread", "process", "graph")  # the executor names, and graph


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
        mode: ``auto``, ``process``, ``thread``, ``graph`` or ``serial``
            (see the module notes).
        num_parallel_calls: processes (default: usable cores), threads
            (default ``DEFAULT_THREADS``) or map calls (default AUTOTUNE).
        batch_size: batch this many elements (stacked in the workers in
            ``process`` mode, so one array per batch crosses the process boundary).
        drop_remainder: drop a last partial batch (static batch dimension).
        shuffle: a new seeded file order each epoch.
        seed: seed of that order.
        deterministic: ``graph`` mode only; the Python modes always keep order.

    Raises:
        ConfigError: bad mode or options, or an ``output_signature`` that
            ``fn``'s graph cannot meet.
    """
    import tensorflow as tf

    mode = _checked_mode(mode, batch_size, num_parallel_calls, listing)
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
    runner_args = (mode, fn, num_parallel_calls, shuffle, seed)
    ds = _python_dataset(tf, items, output_signature, runner_args, batch_size, drop_remainder)
    return ds.prefetch(tf.data.AUTOTUNE)


@contextlib.contextmanager
def file_errors() -> Iterator[None]:
    """Re-raise the :class:`InputError` of a file ``fn`` failed on as itself.

    Wrap the iteration over a :func:`from_files` dataset (or ``model.fit``).
    TensorFlow turns an exception raised in a generator into an ``OpError``
    whose message is a Python traceback ending in the error's line; inside, that
    line comes back as the ``InputError`` naming the file (its ``path``). Any
    other error passes through unchanged.
    """
    import tensorflow as tf

    try:
        yield
    except tf.errors.OpError as exc:
        found = _raised.quoted_in(str(exc))
        if found is None:
            raise
        raise found from exc


def _checked_mode(
    mode: str, batch_size: int | None, num_parallel_calls: int | None, listing: Listing
) -> str:
    """The canonical mode, once the options and the listing are usable."""
    mode = canonical(mode, "mode")  # "threads"/"processes" still work, with a warning
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {MODES}, got {mode!r}")
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if num_parallel_calls is not None and num_parallel_calls < 1 and mode != "graph":
        raise ConfigError(f"num_parallel_calls must be >= 1, got {num_parallel_calls}")
    if not isinstance(listing, Listing):
        raise ConfigError(
            "listing must be a Listing (tfshards.list_files(root) or read_listing(folder)), "
            f"got {type(listing).__name__} {listing!r:.60}"
        )
    if not listing.entries:
        raise ConfigError(f"{listing.root}: the listing has no files")
    return mode


def _python_dataset(
    tf: Any,
    items: list[tuple[str, int]],
    output_signature: Any,
    runner_args: tuple[str, Callable[..., Any], int | None, bool, int],
    batch_size: int | None,
    drop_remainder: bool,
) -> tf.data.Dataset:
    """``fn`` run by a process or thread pool (or serially), fed to tf.data by a generator."""
    mode, fn, num_parallel_calls, shuffle, seed = runner_args
    leaves = tuple(_leaf(tf, spec) for spec in tf.nest.flatten(output_signature))
    template = tf.nest.map_structure(lambda _: None, output_signature)
    # from_generator costs ~0.1-0.5 ms per element it yields, far more than a cheap fn: with
    # fixed shapes, yield stacked chunks (a batch, or CHUNK_ITEMS then unbatch in TF).
    fixed = all(leaf.shape is not None and None not in leaf.shape for leaf in leaves)
    per_task = CHUNK_ITEMS
    if mode == "process":  # a small listing in smaller chunks: every worker gets some
        per_task = chunk_items(len(items), num_parallel_calls or cpu_count())
    chunk = (batch_size or per_task) if fixed else None
    # Threads take one file per task, processes a chunk: no more workers than that.
    tasks = len(items) if mode == "thread" else -(-len(items) // (chunk or per_task))
    runner = Runner(mode, fn, leaves, num_parallel_calls, tasks)
    epochs = iter(range(1 << 62))

    def generate() -> Iterator[Any]:
        order = list(items)
        if shuffle:
            random.Random(f"{seed}/{next(epochs)}").shuffle(order)
        try:
            for leaves_out in runner.run(order, chunk, per_task):
                if chunk is not None and drop_remainder and len(leaves_out[0]) < chunk:
                    return
                yield _pack(template, leaves_out)
        except InputError as exc:
            _raised.keep(exc)
            raise

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
    return ds


def _resolve_mode(mode: str, fn: Callable[..., Any], in_memory: bool) -> str:
    if mode == "auto":
        if hasattr(fn, "get_concrete_function"):
            return "graph"
        return "process" if _picklable(fn) and not in_memory else "thread"
    if mode == "process":
        if in_memory:
            raise ConfigError(
                "memory:// lives in one process, so worker processes cannot read its files; "
                "use mode 'thread'"
            )
        if not _picklable(fn):
            raise ConfigError(
                f"mode 'process' needs a function that pickles (defined at module level, "
                f"not a lambda or closure); {fn!r} does not"
            )
    return mode


def _picklable(fn: Callable[..., Any]) -> bool:
    try:
        pickle.dumps(fn)
    except (pickle.PicklingError, TypeError, AttributeError):
        return False
    return True


# ----------------------------------------------------------------------------- structure


def _leaf(tf: Any, spec: Any) -> Leaf:
    if not isinstance(spec, tf.TensorSpec):
        raise ConfigError(f"output_signature: expected tf.TensorSpec leaves, found {spec!r}")
    dims = None if spec.shape.rank is None else tuple(spec.shape.as_list())
    dtype = None if spec.dtype == tf.string else np.dtype(spec.dtype.as_numpy_dtype).str
    return Leaf(dtype, dims, spec.name or "")


def _pack(template: Any, leaves: Sequence[Any]) -> Any:
    """``template``'s structure filled from ``leaves`` in ``tf.nest`` (sorted-key) order."""
    it = iter(leaves)

    def build(node: Any) -> Any:
        if isinstance(node, Mapping):
            built = {key: build(node[key]) for key in sorted(node)}
            return {key: built[key] for key in node}
        if isinstance(node, (tuple, list)):
            return type(node)(build(item) for item in node)
        return next(it)

    return build(template)


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
