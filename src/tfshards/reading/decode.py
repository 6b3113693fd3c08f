"""Parse batches of serialized examples and decode their images, as TensorFlow ops; the
static image shape a dataset gives, and the formats its images are stored in."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tfshards.errors import ConfigError, TfshardsError
from tfshards.format.schema import FeatureSpec
from tfshards.reading import chunks
from tfshards.reading.decodeplan import JPEG
from tfshards.reading.gate import Gate
from tfshards.reading.options import DecodeOptions
from tfshards.shardset import imagestats
from tfshards.shardset.manifest import Manifest, ShardInfo

if TYPE_CHECKING:
    import tensorflow as tf

MAX_UNROLL = 256  # images per batch decoded by one op each; larger batches loop (graph size)
JPEG_RATIOS = (1, 2, 4, 8)  # the scales libjpeg decodes at in the DCT domain
_TF_DTYPE = {"bytes": "string", "int64": "int64", "float": "float32"}


def parse_fn(
    manifest: Manifest, features: Sequence[str] | None = None, *, single: bool = False
) -> Callable[[tf.Tensor], dict[str, Any]]:
    """A function parsing a batch of serialized records into ``{name: batch}``.

    Built from the manifest's schema: fixed shapes become ``FixedLenFeature``
    (dense ``(batch, *shape)``), variable ones ``RaggedFeature`` (``(batch, None)``).
    ``features`` picks the names (default: all). ``single`` parses one record
    (no batch dimension) instead.
    """
    import tensorflow as tf

    schema = {spec.name: spec for spec in manifest.schema}
    wanted = list(schema) if features is None else list(dict.fromkeys(features))
    missing = [name for name in wanted if name not in schema]
    if missing:
        raise ConfigError(
            f"features {missing} are not in the shards' schema (expected some of {sorted(schema)})"
        )
    spec_map = {name: _tf_feature(tf, schema[name]) for name in wanted}

    parse_op = tf.io.parse_single_example if single else tf.io.parse_example

    def parse(serialized: tf.Tensor) -> dict[str, Any]:
        return dict(parse_op(serialized, spec_map))

    return parse


def decode_images(
    encoded: tf.Tensor,
    shape: tuple[int, int, int],
    *,
    resize: bool = False,
    dtype: str = "float32",
    batch_size: int | None = None,
    scaled: bool = True,
    jpeg: bool = False,
) -> tf.Tensor:
    """Decode a batch of JPEG/PNG/GIF/BMP bytes into ``(batch, *shape)`` images.

    ``float32`` images are in [0, 1], ``uint8`` ones as stored. ``resize``
    scales each image to ``shape`` (bilinear); without it every image must
    already have that shape. ``scaled`` and ``jpeg``: see :func:`decode_image`.

    A batch of up to ``batch_size`` (at most ``MAX_UNROLL``) is decoded by one
    op per image in the graph, which TensorFlow may also run side by side; a
    shorter batch (the last) is padded with its first image and cut back after:
    one ``tf.cond`` per batch graph of 128 96 px JPEGs took it from 262-286 to
    330-353 us of CPU per image. Without ``batch_size`` the images go through
    ``tf.map_fn``.
    """
    import tensorflow as tf

    def one(data: tf.Tensor) -> tf.Tensor:
        return decode_image(
            data, shape, resize=resize, dtype=dtype, scaled=scaled, rescale=False, jpeg=jpeg
        )

    decoded = tf.float32 if resize and dtype == "float32" else tf.uint8

    def looped() -> tf.Tensor:
        return tf.map_fn(one, encoded, fn_output_signature=tf.TensorSpec(shape, decoded))

    if batch_size is None or batch_size > MAX_UNROLL:
        images = looped()
    elif encoded.shape[0] == batch_size:
        images = tf.stack([one(data) for data in tf.unstack(encoded, num=batch_size)])
    else:
        count = tf.shape(encoded)[0]
        padding = tf.repeat(encoded[:1], batch_size - count)
        padded = tf.reshape(tf.concat([encoded, padding], 0), [batch_size])
        images = tf.stack([one(data) for data in tf.unstack(padded, num=batch_size)])[:count]
    if dtype == "uint8":
        return images
    return tf.cast(images, tf.float32) * (1.0 / 255.0)


def decode_image(
    data: tf.Tensor,
    shape: tuple[int, int, int],
    *,
    resize: bool = False,
    dtype: str = "float32",
    scaled: bool = True,
    rescale: bool = True,
    jpeg: bool = False,
) -> tf.Tensor:
    """Decode one encoded image into a ``shape`` tensor (see :func:`decode_images`).

    With ``resize`` and ``scaled``, a JPEG at least twice the target size in
    both dimensions is decoded at 1/2, 1/4 or 1/8 scale in the DCT domain
    (``tf.io.decode_jpeg(ratio=...)``, the largest ratio that keeps both sides
    at or above the target), then resized. That skips most of the inverse DCT
    and the resize's input pixels: a 512 px JPEG read at 224 cost ~0.88 ms
    instead of ~1.24 ms on this machine; Huffman decoding stays. The pixels
    differ slightly from a full decode + bilinear resize: libjpeg averages
    each 2x2 (4x4, 8x8) block while decoding, so there is less aliasing. Pass
    ``scaled=False`` for the full decode. Other formats always decode whole.
    The per-image choice is a ``tf.cond`` and a ``switch_case``, ~60-80 us of
    control flow per image in a ``tf.data`` map: :mod:`tfshards.reading.decodeplan`
    turns it on only for sets whose images are at least twice the target.
    ``rescale`` divides ``float32`` images by 255 (``decode_images`` does it
    once per batch instead). ``jpeg``: every image is a JPEG (the set's
    statistics say so), decoded by ``decode_jpeg`` without sniffing the
    format: the same pixels for ~11% less CPU at 512 px.
    """
    import tensorflow as tf

    height, width, channels = shape
    jpeg = jpeg and channels in (1, 3)

    def whole() -> tf.Tensor:
        if jpeg:
            return tf.io.decode_jpeg(data, channels=channels)
        return tf.io.decode_image(data, channels=channels, expand_animations=False)

    if resize and scaled and jpeg:
        image = _scaled_jpeg(data, shape)
    elif resize and scaled and channels in (1, 3):
        image = tf.cond(tf.io.is_jpeg(data), lambda: _scaled_jpeg(data, shape), whole)
    else:
        image = whole()
    if resize:
        image = tf.image.resize(image, (height, width))  # float32 in [0, 255]
        if dtype != "float32":
            return tf.cast(tf.round(image), tf.uint8)
    else:
        image = tf.ensure_shape(image, shape)
    if dtype == "float32" and rescale:
        return tf.cast(image, tf.float32) * (1.0 / 255.0)
    return image


def _scaled_jpeg(data: tf.Tensor, shape: tuple[int, int, int]) -> tf.Tensor:
    """The JPEG decoded at the smallest DCT scale whose sides are >= ``shape``'s."""
    import tensorflow as tf

    height, width, channels = shape
    stored = tf.io.extract_jpeg_shape(data)  # reads the header only
    branches = []
    index = tf.constant(0)
    for i, ratio in enumerate(JPEG_RATIOS):
        branches.append(lambda r=ratio: tf.io.decode_jpeg(data, channels=channels, ratio=r))
        if i:  # libjpeg rounds the scaled size up: ceil(side / ratio)
            fits = tf.logical_and(
                (stored[0] + ratio - 1) // ratio >= height,
                (stored[1] + ratio - 1) // ratio >= width,
            )
            index += tf.cast(fits, tf.int32)
    return tf.switch_case(index, branches)


def _tf_feature(tf: Any, spec: FeatureSpec) -> Any:
    dtype = getattr(tf, _TF_DTYPE[spec.dtype])
    if spec.shape is None:  # int64 row splits, as ragged_batch gives them record by record
        return tf.io.RaggedFeature(dtype, row_splits_dtype=tf.int64)
    return tf.io.FixedLenFeature(spec.shape, dtype)


def image_shape(
    shards: Sequence[ShardInfo],
    paths: Sequence[str],
    gate: Gate,
    manifest: Manifest,
    decoding: DecodeOptions,
    stored_channels: int | None = None,
) -> tuple[tuple[int, int, int], tuple[int, int] | None]:
    """The static image shape (asked for, or the first image's) and the stored image size.

    The channels are those asked for, else ``stored_channels`` (see
    :func:`common_channels`), else the first image's. The stored size is the
    written ``resize``, or the first image's: read (header only for a JPEG)
    when the shape or the decode plan needs it.
    """
    image_size, channels = decoding.image_size, decoding.channels or stored_channels
    side = None if manifest.resize is None else manifest.resize.size
    stored = None if side is None else (side, side)
    asked = None
    if image_size is not None and channels is not None:
        asked = (image_size[0], image_size[1], channels)
    if asked is not None and (stored is not None or not decoding.scaled_decode):
        return asked, stored
    import tensorflow as tf

    nonempty = [p for s, p in zip(shards, paths, strict=True) if s.records]
    first = chunks.first_record(gate, nonempty[0]) if nonempty else None
    if first is None:
        if asked is not None:
            return asked, stored
        raise ConfigError("the shards hold no records; nothing to read")
    feature = manifest.image_feature
    spec = {feature: tf.io.FixedLenFeature([], tf.string)}
    data = tf.io.parse_single_example(first, spec)[feature]
    if asked is not None and bool(tf.io.is_jpeg(data)):
        height, width, found = (int(d) for d in tf.io.extract_jpeg_shape(data))
    else:
        image = tf.io.decode_image(data, channels=channels or 0, expand_animations=False)
        height, width, found = (int(d) for d in image.shape)
    source = (height, width)
    if image_size is not None:
        height, width = image_size
    return (height, width, channels or found), source


def stored_stats(manifest: Manifest, **storage_options: Any) -> imagestats.ImageStats | None:
    """The image statistics the write counted in the set's version, merged over its buckets;
    None for a version without them, where they cannot be read, or where their format or
    channel counts do not count the manifest's records once each (nothing is then taken
    from them: the images are decoded as any format, at the first image's channels)."""
    try:
        found = imagestats.read_version(manifest.directory, **storage_options)
        if found is None:
            return None
        stats = imagestats.merged(found.buckets.values())
    except (OSError, TfshardsError, TypeError, ValueError, OverflowError):
        return None
    # Each count is a whole number >= 0 (ImageStats.from_json refuses any other).
    if any(sum(counts.values()) != manifest.records for counts in (stats.formats, stats.channels)):
        return None
    return stats


def check_channels(
    manifest: Manifest, channels: int | None, stats: imagestats.ImageStats | None
) -> None:
    """Refuse ``channels=4`` for a set holding JPEGs (they decode to 1 or 3), by its image
    statistics, before a batch fails in TensorFlow."""
    jpegs = stats.formats.get(JPEG, 0) if stats is not None else 0
    if channels == 4 and jpegs:
        raise ConfigError(
            f"{manifest.directory}: channels=4 asked, but {jpegs} of its images are JPEGs "
            "(by its image statistics), which decode to 1 or 3 channels: pass channels 1 or 3"
        )


def several_sizes(stats: imagestats.ImageStats | None) -> str:
    """The images' sizes said, where the statistics count more than one; else ``""``.

    Exact: each histogram keeps its smallest and largest value. Images whose header
    told no size are not counted, and a set without statistics says nothing here.
    """
    if stats is None or not stats.width.total:
        return ""
    width, height = stats.width, stats.height
    if width.low == width.high and height.low == height.high:
        return ""
    return f"width {width.low}-{width.high} px, height {height.low}-{height.high} px"


def common_channels(stats: imagestats.ImageStats | None) -> int | None:
    """The channels to convert every image to when none are asked for, from the statistics.

    The count the images' headers agree on: 1 where each is grey (with or without alpha),
    3 where each is colour, 4 where each has 4 and no image is a JPEG (a JPEG decodes to 1
    or 3); 3 where they differ, so that a grayscale image first does not make a set of
    colour images gray, and a GIF (3 channels only) among grayscale PNGs still decodes.
    Headers that did not tell their channels (a JPEG libjpeg reads past a fault in) do not
    count. None without statistics or without one told count: the first image's is taken.
    """
    if stats is None:
        return None
    found = {ch for ch, n in stats.channels.items() if n} - {imagestats.UNKNOWN_CHANNELS}
    if not found:
        return None
    if found <= {"1", "2"}:
        return 1
    if found == {"4"} and not stats.formats.get("JPEG"):
        return 4
    return 3
