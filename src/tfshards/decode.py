"""Parse batches of serialized examples and decode their images, as TensorFlow ops."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tfshards.errors import ConfigError
from tfshards.manifest import Manifest
from tfshards.schema import FeatureSpec

if TYPE_CHECKING:
    import tensorflow as tf

MAX_UNROLL = 256  # images per batch decoded by one op each; larger batches loop (graph size)
_TF_DTYPE = {"bytes": "string", "int64": "int64", "float": "float32"}


def parse_fn(
    manifest: Manifest, features: Sequence[str] | None = None
) -> Callable[[tf.Tensor], dict[str, Any]]:
    """A function parsing a batch of serialized records into ``{name: batch}``.

    Built from the manifest's schema: fixed shapes become ``FixedLenFeature``
    (dense ``(batch, *shape)``), variable ones ``RaggedFeature`` (``(batch, None)``).
    ``features`` picks the names (default: all).
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

    def parse(serialized: tf.Tensor) -> dict[str, Any]:
        return dict(tf.io.parse_example(serialized, spec_map))

    return parse


def decode_images(
    encoded: tf.Tensor,
    shape: tuple[int, int, int],
    *,
    resize: bool = False,
    dtype: str = "float32",
    batch_size: int | None = None,
) -> tf.Tensor:
    """Decode a batch of JPEG/PNG/GIF/BMP bytes into ``(batch, *shape)`` images.

    ``float32`` images are in [0, 1], ``uint8`` ones as stored. ``resize``
    scales each image to ``shape`` (bilinear); without it every image must
    already have that shape.

    A batch of ``batch_size`` (up to ``MAX_UNROLL``) is decoded by one op per
    image in the graph, which TensorFlow may also run side by side; other
    sizes (the last partial batch) go through ``tf.map_fn``, whose loop cost
    ~5 us more per image here (and a per-element ``tf.data`` map ~40 us).
    """
    import tensorflow as tf

    height, width, channels = shape

    def one(data: tf.Tensor) -> tf.Tensor:
        image = tf.io.decode_image(data, channels=channels, expand_animations=False)
        if resize:
            image = tf.image.resize(image, (height, width))  # float32 in [0, 255]
            return image if dtype == "float32" else tf.cast(tf.round(image), tf.uint8)
        return tf.ensure_shape(image, shape)

    decoded = tf.float32 if resize and dtype == "float32" else tf.uint8

    def looped() -> tf.Tensor:
        return tf.map_fn(one, encoded, fn_output_signature=tf.TensorSpec(shape, decoded))

    def unrolled() -> tf.Tensor:
        return tf.stack([one(data) for data in tf.unstack(encoded, num=batch_size)])

    if batch_size is None or batch_size > MAX_UNROLL:
        images = looped()
    elif encoded.shape[0] == batch_size:
        images = unrolled()
    else:
        images = tf.cond(tf.shape(encoded)[0] == batch_size, unrolled, looped)
    if dtype == "uint8":
        return images
    return tf.cast(images, tf.float32) * (1.0 / 255.0)


def _tf_feature(tf: Any, spec: FeatureSpec) -> Any:
    dtype = getattr(tf, _TF_DTYPE[spec.dtype])
    if spec.shape is None:
        return tf.io.RaggedFeature(dtype)
    return tf.io.FixedLenFeature(spec.shape, dtype)
