"""Save a trained model: the ``.keras`` file, and a SavedModel that serves encoded images.

The SavedModel's ``serving_default`` signature takes a batch of encoded image
bytes (JPEG, PNG, GIF or BMP), decodes and resizes them exactly as training
read them, and returns ``probabilities``, ``class_id`` and ``label`` (the
manifest's label names): it loads with ``tf.saved_model.load`` alone, or in
TensorFlow Serving, without this package.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

from tfshards import atomicfile, storage
from tfshards.training.outputs import check_target


def save_model(model: Any, url: str) -> None:
    """Save a Keras model as ``.keras`` at ``url`` (local or fsspec), atomically."""
    with tempfile.TemporaryDirectory(prefix="tfshards-model-") as tmp:
        local = os.path.join(tmp, "model.keras")  # Keras writes only to local files
        model.save(local)
        with open(local, "rb") as f:
            data = f.read()
    fs, path = storage.open_url(url)
    atomicfile.write_atomic(fs, path, [data])


def export_serving(
    model: Any,
    directory: str,
    *,
    image_size: int,
    channels: int,
    image_dtype: str,
    labels: Sequence[str],
    scaled_decode: bool = True,
) -> None:
    """Write a SavedModel serving raw image bytes to the local ``directory``.

    Written next to ``directory``, flushed to disk (each file and folder) and
    renamed into place, so a reader never sees half an export, even after a
    power loss; an older export there is replaced.

    Args:
        model: the trained Keras model (images of ``image_dtype`` in).
        directory: the SavedModel folder (local path).
        image_size: height = width the images are resized to (bilinear).
        channels: channels they are converted to.
        image_dtype: what the model takes: ``float32`` in [0, 1] or ``uint8``.
        labels: class names, index = class id.
        scaled_decode: decode large JPEGs at a reduced scale first, as training
            did (:func:`tfshards.reading.decode.decode_image`).
    """
    import keras
    import tensorflow as tf

    from tfshards.reading.decode import decode_images

    shape = (image_size, image_size, channels)
    names = tf.constant(list(labels))

    def predict(images: Any) -> Any:
        decoded = decode_images(images, shape, resize=True, dtype=image_dtype, scaled=scaled_decode)
        return tf.cast(model(decoded, training=False), tf.float32)

    def serve(images: Any) -> dict[str, Any]:
        # A request of no image answers empty rows: the model itself fails on an empty batch
        # (oneDNN's second convolution: "input depth must be evenly divisible by filter depth").
        probs = tf.cond(
            tf.size(images) > 0,
            lambda: predict(images),
            lambda: tf.zeros((0, len(labels)), tf.float32),
        )
        ids = tf.argmax(probs, axis=-1, output_type=tf.int32)
        return {"probabilities": probs, "class_id": ids, "label": tf.gather(names, ids)}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        "serving_default", serve, input_signature=[tf.TensorSpec([None], tf.string, name="images")]
    )
    target = os.path.abspath(directory)
    parent = os.path.dirname(target)
    atomicfile.make_dirs(parent)  # a new folder's entry is flushed too
    tmp = tempfile.mkdtemp(prefix=".export-", dir=parent)
    try:
        written = os.path.join(tmp, "model")
        archive.write_out(written, verbose=False)
        # Keras writes without fsync: without it a power loss after the rename can
        # leave the export's name on empty or missing files.
        atomicfile.fsync_tree(written)
        check_target(target)  # still an earlier export, or nothing
        if os.path.exists(target):
            os.replace(target, os.path.join(tmp, "old"))  # inside the temp folder: ours
        os.replace(written, target)
        atomicfile.fsync_dir(parent)  # the rename itself lasts
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
