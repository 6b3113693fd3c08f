"""What :func:`tfshards.reading.loader.make_dataset` is asked for, as checked frozen values.

:class:`ReadOptions`: which records reach the model, in what order and
batches, from where, on how many threads. :class:`DecodeOptions`: what each
record becomes (the image's size, channels and dtype, the features
returned). Each checks itself when built, with the one-line
:class:`~tfshards.errors.ConfigError` :func:`make_dataset` raised for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfshards.errors import ConfigError
from tfshards.reading.epochorder import Position, is_whole

DTYPES = ("float32", "uint8")
ORDERS = ("epoch", "buffer")
CHANNELS = (None, 1, 3, 4)


@dataclass(frozen=True)
class ReadOptions:
    """Which records, in what order and batches, read how.

    Attributes:
        batch_size: records per batch (>= 1).
        training: shuffle (``order``), repeat and drop the last partial batch
            by default.
        seed: seeds the training order; the same seed gives the same order when
            ``deterministic`` is True.
        deterministic: True keeps the element order a pure function of
            ``seed``; False lets parallel stages hand out whatever is ready
            first. None: TensorFlow's default (True).
        shuffle_buffer: records permuted together when training (a window of
            the ``epoch`` order, or the ``buffer`` order's shuffle buffer); None:
            ~32 MB of records for ``epoch`` (about three windows are held),
            ~64 MB for ``buffer``; 0 shuffles only the ~1 MB units (``epoch``)
            or the file order (``buffer``).
        order: the training order. ``"epoch"``: each epoch's order is a pure
            function of the manifest, ``seed``, the epoch and ``worker``
            (:mod:`tfshards.reading.epochorder`), so a stream can start at any
            ``start``. ``"buffer"``: a seeded file shuffle into a record shuffle
            buffer reshuffled each epoch, which cannot be resumed mid-epoch.
            ``cycle_length`` and ``parallel_reads`` apply to it and to evaluation.
        start: ``(epoch, record)`` (or a :class:`~tfshards.reading.epochorder.Position`)
            where the ``epoch`` order starts: the rest of that epoch, then the
            following ones; None: ``(0, 0)``. Exact unless ``deterministic`` is
            False (a parallel decode may then swap records near the cut).
        worker: ``(index, count)``: with the ``epoch`` order, this worker's
            ``records // count`` records of every epoch (disjoint blocks of one
            global order; the last ``records % count`` are read by none).
        cycle_length: shard files open at once, their records interleaved one
            by one; None: up to ``loader.DEFAULT_CYCLE_LENGTH``.
        parallel_reads: threads reading those files (``interleave``'s
            ``num_parallel_calls``); None reads them on one thread when
            decoding a batch at a time, which keeps up with decoding from
            local disk at half the CPU cost (see the loader's module notes),
            and with AUTOTUNE on the per-record path: there one reading thread
            kept the 2 cores 0.65 busy under load against 0.92 with AUTOTUNE
            (512 px JPEGs read at 224; 2% more CPU per record). AUTOTUNE for
            a slow network filesystem.
        repeat: repeat forever; None means ``training``.
        drop_remainder: drop a last partial batch, making the batch dimension
            static; None means ``repeat`` (an endless stream loses nothing).
        cache_dir: local cache for remote shards (see :mod:`tfshards.reading.cache`).
        storage_options: fsspec options for the shards' location.
    """

    batch_size: int
    training: bool
    seed: int = 0
    deterministic: bool | None = None
    shuffle_buffer: int | None = None
    cycle_length: int | None = None
    parallel_reads: int | None = None
    repeat: bool | None = None
    drop_remainder: bool | None = None
    cache_dir: str | None = None
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    order: str = "epoch"
    start: Position | tuple[int, int] | None = None
    worker: tuple[int, int] = (0, 1)

    def __post_init__(self) -> None:
        _whole("batch_size", self.batch_size, 1)
        if not isinstance(self.training, bool):
            raise ConfigError(f"training must be True or False, got {self.training!r:.60}")
        _whole("seed", self.seed, None)
        for name, least in (("shuffle_buffer", 0), ("cycle_length", 1), ("parallel_reads", 1)):
            if getattr(self, name) is not None:
                _whole(name, getattr(self, name), least)
        if self.order not in ORDERS:
            raise ConfigError(f"order must be one of {ORDERS}, got {self.order!r}")
        index, count = worker_of(self.worker)
        object.__setattr__(self, "worker", (index, count))
        start = self.start
        if start is not None:
            object.__setattr__(self, "start", Position.of(start))
        seekable = self.training and self.order == "epoch"
        if (start is not None or count > 1) and not seekable:
            raise ConfigError("start and worker need training=True with order='epoch'")
        object.__setattr__(self, "storage_options", dict(self.storage_options or {}))

    @property
    def position(self) -> Position:
        """Where the training stream starts."""
        return self.start if isinstance(self.start, Position) else Position()

    @property
    def repeats(self) -> bool:
        """Whether the records repeat forever."""
        return self.training if self.repeat is None else self.repeat

    @property
    def drops_remainder(self) -> bool:
        """Whether a last partial batch is dropped."""
        return self.repeats if self.drop_remainder is None else self.drop_remainder


@dataclass(frozen=True)
class DecodeOptions:
    """What each record becomes.

    Attributes:
        image_size: ``(height, width)`` to resize to (bilinear); None keeps the
            stored size, which must then be the same for every image. A set
            written with ``resize`` (:mod:`tfshards.writing.resize`) at this size is
            decoded without resizing.
        channels: 1, 3 or 4 to convert every image to; None takes the count
            every image's header shows, 3 where they differ (from the image
            statistics of the version; the first image's without them).
        image_dtype: ``"float32"`` (in [0, 1]) or ``"uint8"`` (0..255, as
            stored): skips the conversion, ~15% of the CPU per small image, and
            sends a quarter of the bytes to an accelerator; scale in the model
            (``keras.layers.Rescaling(1 / 255)``).
        decode: decode the image; False returns its encoded bytes.
        scaled_decode: when resizing a set whose first image is at least twice
            the target size in both sides, decode each JPEG that is at 1/2, 1/4
            or 1/8 scale first (see :func:`tfshards.reading.decode.decode_image`:
            ~30% less CPU for 512 px read at 224, slightly different pixels);
            False decodes whole. Sets of smaller images always decode whole
            (:mod:`tfshards.reading.decodeplan`).
        per_record: parse and decode record by record in a parallel map, then
            batch; False parses and decodes a batch at a time. None: a batch at
            a time for images of at most 64 x 64 pixels (1.45x the usual reader
            at 32 px, against 1.07x record by record), record by record above
            (:mod:`tfshards.reading.decodeplan`).
        features: names to return as a dict ``{name: batch}`` instead of the
            image alone; the image feature among them is decoded, variable
            length features come back ragged.
    """

    image_size: tuple[int, int] | None = None
    channels: int | None = None
    image_dtype: str = "float32"
    decode: bool = True
    scaled_decode: bool = True
    per_record: bool | None = None
    features: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if self.channels not in CHANNELS:
            raise ConfigError(f"channels must be 1, 3 or 4, got {self.channels}")
        if self.image_dtype not in DTYPES:
            raise ConfigError(f"image_dtype must be 'float32' or 'uint8', got {self.image_dtype!r}")
        size = self.image_size
        if size is not None and (
            not isinstance(size, (tuple, list))
            or len(size) != 2
            or not all(is_whole(v) and v >= 1 for v in size)
        ):
            raise ConfigError(f"image_size must be (height, width) integers >= 1, got {size!r}")
        if isinstance(self.features, str):  # a name, not names: it would read its letters
            raise ConfigError(f"features must be a list of names, got {self.features!r}")
        if size is not None:
            object.__setattr__(self, "image_size", tuple(size))
        if self.features is not None:
            object.__setattr__(self, "features", tuple(self.features))


def worker_of(worker: Any) -> tuple[int, int]:
    """``worker`` as ``(index, count)`` integers with ``0 <= index < count``.

    Raises:
        ConfigError: anything else, in one line.
    """
    if (
        not isinstance(worker, (tuple, list))
        or len(worker) != 2
        or not all(is_whole(v) for v in worker)
    ):
        raise ConfigError(f"worker must be (index, count) integers, got {worker!r}")
    index, count = worker
    if count < 1 or not 0 <= index < count:
        raise ConfigError(f"worker must be (index, count), 0 <= index < count, got {worker}")
    return int(index), int(count)


def batch_size_of(value: Any) -> int:
    """``value`` as a batch size (an integer >= 1).

    Raises:
        ConfigError: anything else, in one line.
    """
    _whole("batch_size", value, 1)
    return int(value)


def _whole(name: str, value: Any, least: int | None) -> None:
    """Refuse ``value`` unless it is an integer (``>= least`` when given): one line."""
    if not is_whole(value) or (least is not None and value < least):
        at_least = f" >= {least}" if least is not None else ""
        raise ConfigError(f"{name} must be an integer{at_least}, got {value!r}")
