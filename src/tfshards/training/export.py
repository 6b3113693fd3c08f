"""Save a trained model: the ``.keras`` file, and a SavedModel that serves encoded images.

The SavedModel's ``serving_default`` signature takes a batch of encoded image
bytes (JPEG, PNG, GIF or BMP), decodes and resizes them exactly as training
read them, and returns ``probabilities``, ``class_id`` and ``label`` (the
manifest's label names): it loads with ``tf.saved_model.load`` alone, or in
TensorFlow Serving, without this package.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import zipfile
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
            data = _reproducible(f.read())
    fs, path = storage.open_url(url)
    atomicfile.write_atomic(fs, path, [data])


# The zip entries' time: the earliest a zip can hold, as Keras gives its other entries.
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def _reproducible(archive: bytes) -> bytes:
    """``archive`` (a ``.keras`` zip) without what differs between two saves of the same
    model: ``metadata.json``'s ``date_saved`` left out, every entry dated 1980-01-01, and
    ``config.json``'s ``shared_object_id`` values (Python ``id()`` of an object the model
    uses twice) numbered 0, 1, ... in order of first appearance.

    Keras 3.15 writes the save time, the clock's time on the weights entry and those
    ids, so two trainings of the same weights (two processes, a second apart)
    differed: every retrain on the same data changed ``dvc.lock`` and stored a new
    copy in DVC's cache. Entries keep their order, names, compression and content
    otherwise; Keras reads no save time and matches shared objects by equal ids.
    Layer names stay Keras' own: a model built after others in one process has
    suffixed names (``conv2d_4``); the train stage builds one in a fresh process.
    """
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            body = source.read(info)
            if info.filename == "metadata.json":
                metadata = json.loads(body)
                metadata.pop("date_saved", None)
                body = json.dumps(metadata).encode()
            elif info.filename == "config.json":
                body = json.dumps(_renumbered(json.loads(body), {})).encode()
            entry = zipfile.ZipInfo(info.filename, date_time=_ZIP_EPOCH)
            entry.compress_type = info.compress_type
            entry.external_attr = info.external_attr
            target.writestr(entry, body)
    return out.getvalue()


def _renumbered(node: Any, ids: dict[Any, int]) -> Any:
    """``node`` with each ``shared_object_id`` replaced by its order of first appearance."""
    if isinstance(node, list):
        return [_renumbered(item, ids) for item in node]
    if not isinstance(node, dict):
        return node
    return {
        key: ids.setdefault(value, len(ids))
        if key == "shared_object_id"
        else _renumbered(value, ids)
        for key, value in node.items()
    }


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
