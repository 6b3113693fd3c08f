"""Feed Keras from shards: a seeded train/val split by shard file, and a fast tf.data reader.

Training reads the records in :mod:`tfshards.reading.epochorder`'s seekable
order (windows of ~1 MB units, permuted within; :mod:`tfshards.reading.epochdata`),
or with ``order="buffer"`` ``interleave`` over the files (seeded file order) ->
record ``shuffle``; evaluation reads the files in order. Then ``repeat`` ->
parse and decode record by record in a parallel map -> ``batch`` -> ``prefetch``
(images of at most 64 x 64 pixels: ``batch`` first, then parse and decode a
batch at a time).
Both read alike: 20,000 32 px JPEGs in 16 shards, batches of 64, 2 shared cores:
5,350-6,415 records/s (buffer) against 5,750-5,935 (epoch order), two runs each.
:mod:`tfshards.reading.decodeplan` picks the path, and whether JPEGs are decoded at
a reduced scale, from the set's image size. A batch at a time (``per_record=False``)
batches first, parses a batch with one ``parse_example`` and decodes it with
one op per image in the batch's graph (:func:`decode_images`): it saves
tf.data's per-record work, most of a tiny image's cost, but its few large work
items keep fewer threads busy as images grow (see the plan's notes).

A parallel ``interleave`` cost 10-17 us per record against 5-7 us on one
thread (20,000 x 96 px JPEGs, 2 cores) and bought nothing a batch at a time
(the files are local: remote shards are read from the cache), so reads stay
on one thread there; record by record they read in parallel (see
``parallel_reads``).

TensorFlow is imported on first use, not with this module: :func:`split` is
pure and runs where TensorFlow is absent or too slow to import (a DVC stage).

Corrupt data is never skipped, and TensorFlow never opens a shard file. A
local shard whose size, sha256, framing or record count differs from the
manifest stops :func:`make_dataset` (:mod:`tfshards.reading.gate`: TensorFlow
reads a shard cut at a record boundary as a shorter valid file); remote
shards are verified as they reach the cache. Records then reach tf.data in
~1 MB chunks that :mod:`tfshards.reading.chunks` reads and checks (framing,
both CRCs, record count) as it reads, in place of ``TFRecordDataset``, which
trusts a record's length once the length's CRC holds: a header overwritten in
place after verification, declaring 2**36 bytes, crashed it with SIGSEGV. A
bad record (a file changed after it was verified, or content TensorFlow
cannot parse or decode) stops the run with a TensorFlow error. Wrap the loop
or ``model.fit`` in :func:`shard_errors` to have it re-raised as a
:class:`~tfshards.errors.RecordError` naming the shard, record and byte offset.

The split (:mod:`tfshards.shardset.split`), the parse and decode ops
(:mod:`tfshards.reading.decode`) and the corrupt-record naming
(:mod:`tfshards.reading.corruption`) live in their own modules.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tfshards import storage
from tfshards.errors import ConfigError, RecordError, ShardError
from tfshards.format.wire import COMPRESSIONS
from tfshards.reading import chunks, epochdata
from tfshards.reading.cache import ShardCache
from tfshards.reading.corruption import find_corrupt_record, first_image_error
from tfshards.reading.decode import (
    check_channels,
    common_channels,
    decode_image,
    decode_images,
    image_shape,
    parse_fn,
    several_sizes,
    stored_stats,
)
from tfshards.reading.decodeplan import DecodePlan, plan
from tfshards.reading.epochorder import Position
from tfshards.reading.gate import Gate
from tfshards.reading.options import DecodeOptions, ReadOptions, batch_size_of, worker_of
from tfshards.shardset.manifest import Manifest, ShardInfo, expect

if TYPE_CHECKING:
    import tensorflow as tf


__all__ = [
    "AUTOTUNE",
    "DEFAULT_CYCLE_LENGTH",
    "SHUFFLE_BUFFER_BYTES",
    "from_options",
    "make_dataset",
    "records_dataset",
    "resolve_paths",
    "steps_per_epoch",
]

AUTOTUNE = -1  # the value of tf.data.AUTOTUNE, without importing TensorFlow
SHUFFLE_BUFFER_BYTES = 64 << 20  # default record shuffle buffer: ~64 MB of serialized records
WINDOW_BYTES = 32 << 20  # default window of the epoch order; about three are held at once
DEFAULT_CYCLE_LENGTH = 16  # files whose records mix in each batch; 16 x ~1 MB chunks


# ----------------------------------------------------------------------------- dataset


def make_dataset(
    shards: Sequence[ShardInfo],
    manifest: Manifest,
    *,
    batch_size: int,
    training: bool,
    seed: int = 0,
    image_size: tuple[int, int] | None = None,
    channels: int | None = None,
    image_dtype: str = "float32",
    deterministic: bool | None = None,
    shuffle_buffer: int | None = None,
    cycle_length: int | None = None,
    parallel_reads: int | None = None,
    repeat: bool | None = None,
    drop_remainder: bool | None = None,
    cache_dir: str | None = None,
    decode: bool = True,
    scaled_decode: bool = True,
    per_record: bool | None = None,
    features: Sequence[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    order: str = "epoch",
    start: Position | tuple[int, int] | None = None,
    worker: tuple[int, int] | None = None,
    input_context: Any = None,
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of ``(inputs, label)`` batches for ``model.fit``.

    By default ``inputs`` is the image as float32 in ``[0, 1]`` of static shape
    ``(batch, height, width, channels)`` and ``label`` an int64 ``(batch,)``.
    Training (``repeat`` defaults to True) gives an endless stream of whole
    epochs back to back, batched across their boundaries: pass
    :func:`steps_per_epoch` to ``fit``. With the default ``order="epoch"``,
    epoch ``e``'s records come in an order fixed by the manifest, ``seed``,
    ``e`` and the worker (:mod:`tfshards.reading.epochorder`); ``start=(epoch,
    record)`` yields exactly the rest of that epoch, then the following epochs
    (after ``k`` batches: ``Position.after(k * batch_size, records per
    epoch)``). ``worker=(index, count)``, or a ``tf.distribute.InputContext``
    as ``input_context``, gives this worker ``records // count`` records of
    every epoch, disjoint from the other workers'. A pass that does not repeat
    knows its length (``len(ds)``).

    ``features=[...]`` gives ``({name: batch}, label)`` instead: e.g. an index
    file's extra columns (:mod:`tfshards.format.columns`) with the image,
    ``features=["image", "tags", "box"]``. A fixed-length column (``float[4]``,
    a scalar) comes as a dense ``(batch, 4)`` / ``(batch,)`` tensor, a
    variable one (``int[]``) as a ``tf.RaggedTensor`` ``(batch, None)``
    (``.to_tensor()`` pads it; a multi-hot target is
    ``tf.reduce_max(tf.one_hot(tags, n), axis=1)``).

    ``shards`` are the shards to read (e.g. ``split.train``) of ``manifest``
    (schema, compression, location), each once, in any order (read in the
    manifest's). The other keywords are the fields of
    :class:`~tfshards.reading.options.ReadOptions` (reading, order, batching)
    and :class:`~tfshards.reading.options.DecodeOptions` (decoding),
    documented there; :func:`from_options` takes the two values.
    """
    read = ReadOptions(
        batch_size=batch_size,
        training=training,
        seed=seed,
        deterministic=deterministic,
        shuffle_buffer=shuffle_buffer,
        cycle_length=cycle_length,
        parallel_reads=parallel_reads,
        repeat=repeat,
        drop_remainder=drop_remainder,
        cache_dir=cache_dir,
        storage_options=storage_options or {},
        order=order,
        start=start,
        worker=_worker(worker, input_context),
    )
    decoding = DecodeOptions(
        image_size=image_size,
        channels=channels,
        image_dtype=image_dtype,
        decode=decode,
        scaled_decode=scaled_decode,
        per_record=per_record,
        features=features,
    )
    return from_options(shards, manifest, read, decoding)


def _worker(worker: tuple[int, int] | None, input_context: Any) -> tuple[int, int]:
    """``(index, count)`` from ``worker`` or a ``tf.distribute.InputContext``; one worker
    of one without either.

    Raises:
        ConfigError: both given, or an ``input_context`` that is no InputContext.
    """
    if input_context is None:
        return worker or (0, 1)
    if worker is not None:
        raise ConfigError("pass worker or input_context, not both: they say the same")
    try:
        return (input_context.input_pipeline_id, input_context.num_input_pipelines)
    except AttributeError:
        raise ConfigError(
            "input_context must be a tf.distribute.InputContext, "
            f"got {type(input_context).__name__} {input_context!r:.60}"
        ) from None


def from_options(
    shards: Sequence[ShardInfo], manifest: Manifest, read: ReadOptions, decoding: DecodeOptions
) -> tf.data.Dataset:
    """:func:`make_dataset` with its options as values: verify, read, batch, decode."""
    import tensorflow as tf

    shards = in_manifest_order(shards, manifest)
    if _seekable(read):
        _check_stream(shards, read)
    paths, gate = resolve_paths(manifest, shards, cache_dir=read.cache_dir, **read.storage_options)
    names = [manifest.image_feature] if decoding.features is None else list(decoding.features)
    shape: tuple[int, int, int] | None = None
    source: tuple[int, int] | None = None
    formats: dict[str, int] | None = None
    if decoding.decode and manifest.image_feature in names:
        stats = stored_stats(manifest, **read.storage_options)
        if decoding.image_size is None and (sizes := several_sizes(stats)):
            raise ConfigError(
                f"{manifest.directory}: images of several sizes ({sizes}, by its image "
                "statistics) are kept at their own size without image_size: pass image_size "
                "(and channels) to resize every image to one shape"
            )
        check_channels(manifest, decoding.channels, stats)
        channels = common_channels(stats)
        try:
            shape, source = image_shape(shards, paths, gate, manifest, decoding, channels)
        except tf.errors.OpError as exc:  # the first image, read for its shape, is bad
            raise first_image_error(
                manifest, shards, exc, cache_dir=read.cache_dir, **read.storage_options
            ) from exc
        formats = None if stats is None else stats.formats
    target = _resize_to(manifest, decoding)
    how = plan(
        source=source,
        target=target,
        per_record=decoding.per_record,
        scaled_decode=decoding.scaled_decode,
        formats=formats,
    )
    records = _shuffled_records(shards, manifest, paths, gate, read, how.per_record)
    to_inputs = _to_inputs(manifest, names, shape, decoding, how, read.batch_size)
    # Our graph functions hold no Python control flow on tensors, so AutoGraph has nothing to
    # rewrite: skipping its source transformation saved ~0.4 s of CPU per dataset built.
    plain = tf.autograph.experimental.do_not_convert
    parallel = {"num_parallel_calls": tf.data.AUTOTUNE, "deterministic": read.deterministic}
    if how.per_record:  # records of a variable-length feature batch as ragged rows
        varying = any(s.shape is None for s in manifest.schema if s.name in names)
        batch = tf.data.Dataset.ragged_batch if varying else tf.data.Dataset.batch
        batches = batch(
            records.map(plain(to_inputs), **parallel),
            read.batch_size,
            drop_remainder=read.drops_remainder,
        )
    else:  # a finite epoch's short last batch is decoded even when dropped, as record by
        # record decodes every record: a bad image there stops the read, never goes unseen
        tail = read.drops_remainder and not read.repeats
        whole = read.drops_remainder and read.repeats
        batches = records.batch(read.batch_size, drop_remainder=whole).map(
            plain(to_inputs), **parallel
        )
        if tail:
            batches = _without_short_batch(tf, batches, read.batch_size)
    # The manifest counts the records: Keras shows steps, not "Unknown".
    count = tf.data.INFINITE_CARDINALITY if read.repeats else _batches(shards, read)
    batches = batches.apply(tf.data.experimental.assert_cardinality(count))
    data_options = tf.data.Options()
    if read.deterministic is not None:
        data_options.deterministic = read.deterministic
    return batches.prefetch(tf.data.AUTOTUNE).with_options(data_options)


def in_manifest_order(shards: Sequence[ShardInfo], manifest: Manifest) -> list[ShardInfo]:
    """``shards`` in the manifest's order, so a stream is a function of which shards it
    reads, not of how they were listed (two workers given one split in two orders read
    100 records twice and 100 never, in a trial).

    Raises:
        ConfigError: no shard, a shard listed twice (its records would come twice an
            epoch), or one that is not the manifest's.
    """
    manifest = expect(manifest)
    if isinstance(shards, (str, bytes)) or not isinstance(shards, Sequence):
        raise ConfigError(f"shards must be a sequence of ShardInfo, got {type(shards).__name__}")
    if not shards:
        raise ConfigError("no shards to read (an empty split?)")
    wrong = next((s for s in shards if not isinstance(s, ShardInfo)), None)
    if wrong is not None:
        raise ConfigError(
            "shards must be ShardInfo values (split(manifest).train, manifest.shards), "
            f"got {type(wrong).__name__} {wrong!r:.60}"
        )
    index = {s.name: i for i, s in enumerate(manifest.shards)}
    seen: set[str] = set()
    for shard in shards:
        if shard.name in seen:
            raise ConfigError(
                f"{shard.name}: listed twice in shards: its records would come twice an epoch"
            )
        seen.add(shard.name)
        at = index.get(shard.name)
        if at is None or manifest.shards[at] != shard:
            raise ConfigError(f"{shard.name}: not a shard of this manifest ({manifest.directory})")
    return sorted(shards, key=lambda s: index[s.name])


def steps_per_epoch(
    shards: Sequence[ShardInfo], batch_size: int, *, worker: tuple[int, int] = (0, 1)
) -> int:
    """Whole batches in one training epoch of ``shards`` for worker ``(index, count)``
    (``order="epoch"``): ``(records // count) // batch_size``. 0 when ``batch_size`` is
    above a worker's records an epoch: pass ``max(1, ...)`` to ``fit`` (as the train
    stage does), each step then a batch across epoch boundaries.

    Raises:
        ConfigError: a shard listed twice (its records would count twice), a batch size
            below 1, or a worker outside ``0 <= index < count``.
    """
    batch_size, (_, count) = batch_size_of(batch_size), worker_of(worker)
    names = [s.name for s in shards]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"{twice}: listed twice in shards: its records would count twice")
    return sum(s.records for s in shards) // count // batch_size


def _batches(shards: Sequence[ShardInfo], read: ReadOptions) -> int:
    """How many batches one pass over ``shards`` gives (their manifest record counts)."""
    records = sum(shard.records for shard in shards)
    if _seekable(read):
        records = records // read.worker[1] - read.position.record
    whole, part = divmod(records, read.batch_size)
    return whole + (1 if part and not read.drops_remainder else 0)


def _resize_to(manifest: Manifest, decoding: DecodeOptions) -> tuple[int, int] | None:
    """The size images are resized to; None when kept (or written resized at that size)."""
    size, stored = decoding.image_size, manifest.resize
    if size is None or (stored is not None and tuple(size) == (stored.size,) * 2):
        return None
    return (size[0], size[1])


def _shuffled_records(
    shards: Sequence[ShardInfo],
    manifest: Manifest,
    paths: Sequence[str],
    gate: Gate,
    read: ReadOptions,
    per_record: bool,
) -> tf.data.Dataset:
    """The serialized records in the training order (or file order), repeated if asked."""
    if _seekable(read):
        import tensorflow as tf

        order = epochdata.epoch_order(shards, manifest, read, WINDOW_BYTES)
        return epochdata.records(tf, gate, paths, order, read.position, repeat=read.repeats)
    parallel_reads = read.parallel_reads
    if parallel_reads is None and per_record:
        parallel_reads = AUTOTUNE  # see ReadOptions.parallel_reads
    records = records_dataset(
        paths,
        gate,
        shuffle_files=read.training,
        seed=read.seed,
        cycle_length=read.cycle_length,
        parallel_reads=parallel_reads,
        deterministic=read.deterministic,
    )
    if read.training:
        buffer = read.shuffle_buffer
        if buffer is None:
            buffer = _default_buffer(manifest, shards)
        if buffer > 1:
            records = records.shuffle(buffer, seed=read.seed + 1, reshuffle_each_iteration=True)
    if read.repeats:
        records = records.repeat()
    return records


def _seekable(read: ReadOptions) -> bool:
    return read.training and read.order == "epoch"


def _check_stream(shards: Sequence[ShardInfo], read: ReadOptions) -> None:
    """Refuse a worker with no record an epoch (its stream would be an endless run of
    empty epochs) and a start past the end of an epoch.

    Raises:
        ConfigError: in one line, with the counts.
    """
    index, count = read.worker
    records = sum(shard.records for shard in shards)
    per_epoch = records // count
    if per_epoch < 1:
        raise ConfigError(
            f"worker ({index}, {count}): {records} records give each of {count} workers 0 "
            f"records an epoch; use at most {records} workers"
        )
    start = read.position
    if start.record >= per_epoch:
        whose = f" for each of {count} workers" if count > 1 else ""
        raise ConfigError(
            f"start ({start.epoch}, {start.record}): an epoch holds {per_epoch} records{whose}, "
            f"so record {start.record} is past its end; "
            f"Position.after(records read, {per_epoch}) gives the position"
        )


def _to_inputs(
    manifest: Manifest,
    names: Sequence[str],
    shape: tuple[int, int, int] | None,
    decoding: DecodeOptions,
    how: DecodePlan,
    batch_size: int,
) -> Callable[[tf.Tensor], tuple[Any, tf.Tensor]]:
    """Serialized records (one, or a batch) -> ``(inputs, label)``: parsed, image decoded."""
    image_feature = manifest.image_feature
    resize = _resize_to(manifest, decoding) is not None
    per_record, scaled, jpeg = how.per_record, how.scaled, how.jpeg
    parse = parse_fn(manifest, [*names, "label"], single=per_record)
    dtype = decoding.image_dtype

    def to_inputs(serialized: tf.Tensor) -> tuple[Any, tf.Tensor]:
        parsed = parse(serialized)
        if shape is not None:
            data = parsed[image_feature]
            parsed[image_feature] = (
                decode_image(data, shape, resize=resize, dtype=dtype, scaled=scaled, jpeg=jpeg)
                if per_record
                else decode_images(
                    data,
                    shape,
                    resize=resize,
                    dtype=dtype,
                    batch_size=batch_size,
                    scaled=scaled,
                    jpeg=jpeg,
                )
            )
        label = parsed.pop("label")
        return (parsed[image_feature] if decoding.features is None else parsed), label

    return to_inputs


def _without_short_batch(tf: Any, batches: tf.data.Dataset, size: int) -> tf.data.Dataset:
    """``batches`` less a short last one, the batch dimension ``size`` again (as
    ``drop_remainder`` gives it)."""
    plain = tf.autograph.experimental.do_not_convert

    def sized(tensor: Any) -> Any:
        if isinstance(tensor, tf.RaggedTensor):
            return tensor
        return tf.ensure_shape(tensor, [size, *tensor.shape[1:]])

    full = batches.filter(plain(lambda _, label: tf.shape(label)[0] == size))
    return full.map(plain(lambda inputs, label: tf.nest.map_structure(sized, (inputs, label))))


def records_dataset(
    paths: Sequence[str],
    gate: Gate,
    *,
    shuffle_files: bool = False,
    seed: int = 0,
    cycle_length: int | None = None,
    parallel_reads: int | None = None,
    deterministic: bool | None = None,
) -> tf.data.Dataset:
    """Serialized records of the local shard files ``paths``, interleaved record by record.

    ``shuffle_files`` reshuffles the file order every epoch from ``seed``.
    Each file is awaited (downloaded and verified, or for a local file
    verified by ``gate``) as it comes up, so reading starts as soon as the
    first shard is in the cache, and read in chunks checked as they are read
    (:mod:`tfshards.reading.chunks`).
    """
    import tensorflow as tf

    if gate.compression not in COMPRESSIONS:
        raise ConfigError(f"compression must be one of {COMPRESSIONS}, got {gate.compression!r}")
    if not paths:
        raise ConfigError("no shards to read")
    files = tf.data.Dataset.from_tensor_slices(list(paths))
    plain = tf.autograph.experimental.do_not_convert  # no tensor control flow to convert
    if shuffle_files and len(paths) > 1:
        files = files.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
    return files.interleave(
        plain(chunks.records(tf, gate)),
        cycle_length=min(len(paths), DEFAULT_CYCLE_LENGTH)
        if cycle_length is None
        else cycle_length,
        block_length=1,
        num_parallel_calls=parallel_reads,
        deterministic=deterministic if parallel_reads else None,
    )


def _default_buffer(manifest: Manifest, shards: Sequence[ShardInfo]) -> int:
    records = sum(s.records for s in shards)
    mean = max(1, manifest.bytes // max(1, manifest.records))
    return max(1, min(records, SHUFFLE_BUFFER_BYTES // mean))


# ----------------------------------------------------------------------------- files


def resolve_paths(
    manifest: Manifest,
    shards: Sequence[ShardInfo],
    *,
    cache_dir: str | None = None,
    **storage_options: Any,
) -> tuple[list[str], Gate]:
    """Local paths to read ``shards`` from, and the fetch bringing them when remote.

    Local shards are read in place once :mod:`tfshards.reading.gate` has verified
    them (size, sha256, framing and record count; once per file and process),
    and again at each open by a ``stat``; every chunk read is checked as it
    is read (:mod:`tfshards.reading.chunks`). Remote shards are fetched into the
    cache in the background, in this order, verified by their sha256, and
    walked by the gate (framing, record count) when first opened.
    """
    in_manifest_order(shards, manifest)  # the same checks; the paths follow ``shards``
    fs, root = storage.open_url(manifest.directory, **storage_options)
    if not storage.is_local(fs):
        cache = ShardCache(cache_dir)
        fetch = cache.fetch(manifest, shards, **storage_options)
        cached = {cache.path(s): (s, manifest.shard_url(s)) for s in shards}
        gate = Gate(
            cached, manifest.compression, before=fetch.wait, check_sha=False, expect=fetch.expect
        )
        return [cache.path(s) for s in shards], gate
    entries = {
        os.path.abspath(storage.join(root, s.name)): (s, manifest.shard_url(s)) for s in shards
    }
    local = Gate(entries, manifest.compression)
    try:
        local.verify_all()
    except ShardError as exc:
        if getattr(exc, "found_sha256", None) is None:
            raise
        # Same size, other bytes: say which record, when one is at fault.
        at_fault = [s for s in shards if s.name == getattr(exc, "shard", None)]
        found = find_corrupt_record(manifest, at_fault, **storage_options)
        if isinstance(found, RecordError):
            raise found from exc
        raise
    return [os.path.abspath(storage.join(root, s.name)) for s in shards], local
