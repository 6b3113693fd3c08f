"""TensorFlow Datasets metadata for a shard set, so ``tfds.builder_from_directory`` reads it.

``dataset_info.json``, ``features.json`` and ``label.labels.txt``, in the
JSON tfds 4.9 writes itself (``DatasetInfo.write_to_directory``), made from
the manifest alone: no TensorFlow, same manifest => same bytes. The whole set
is one split, ``train``, whose file template names the shards as they are
(``<name>-{SHARD_X_OF_Y}.tfrecord``); the train/validation split is chosen
later, from the shard list (:mod:`tfshards.shardset.split`), and tfds slices such as
``train[:90%]`` split by record. tfds reads TFRecords only uncompressed, so a
gzip or zlib set gets no metadata.
"""

from __future__ import annotations

from typing import Any

from tfshards import jsonfile
from tfshards.format.schema import FeatureSpec
from tfshards.shardset.manifest import Manifest

SPLIT = "train"
VERSION = "1.0.0"  # tfds needs one; the set's identity is its fingerprint
_CLASSES = "tensorflow_datasets.core.features."
_DTYPES = {"bytes": "string", "int64": "int64", "float": "float32"}


def tfds_files(manifest: Manifest) -> dict[str, bytes]:
    """The metadata files (name in the version directory -> bytes); empty when compressed."""
    if manifest.compression != "none":
        return {}
    name = str(manifest.params.get("name", "data"))
    info = {
        "description": (
            f"{manifest.records} records from {manifest.listed} listed files, written by "
            f"tfshards (fingerprint {manifest.fingerprint}); manifest.json lists every "
            "shard with its sha256."
        ),
        "fileFormat": "tfrecord",
        "name": name,
        "splits": [
            {
                "filepathTemplate": _escape(name) + "-{SHARD_X_OF_Y}.tfrecord",
                "name": SPLIT,
                "numBytes": str(manifest.bytes),
                "shardLengths": [str(s.records) for s in manifest.shards],
            }
        ],
        "version": VERSION,
    }
    features = {
        "featuresDict": {
            "features": {spec.name: _feature(spec, manifest) for spec in manifest.schema}
        },
        "pythonClassName": _CLASSES + "features_dict.FeaturesDict",
    }
    return {
        "dataset_info.json": _json(info, indent=2),
        "features.json": _json(features, indent=4),
        # tfds strips each name and drops empty lines when it reads this file.
        "label.labels.txt": "".join(f"{label}\n" for label in manifest.labels).encode(),
    }


def _feature(spec: FeatureSpec, manifest: Manifest) -> dict[str, Any]:
    """One feature as tfds describes it: the payload as an image, the label as a class."""
    if spec.name == "label":
        return {
            "classLabel": {"numClasses": str(len(manifest.labels))},
            "pythonClassName": _CLASSES + "class_label_feature.ClassLabel",
        }
    # A transform may replace the payload with anything: then it is plain bytes.
    untransformed = manifest.params.get("transform", "none") == "none"
    if spec.name == manifest.params.get("image_feature", "image") and untransformed:
        return {  # decoded to uint8 HxWx3 (grey and RGBA converted) by tf.io.decode_image
            "image": {"dtype": "uint8", "shape": {"dimensions": ["-1", "-1", "3"]}},
            "pythonClassName": _CLASSES + "image_feature.Image",
        }
    if spec.name in ("path", "sha256") and spec.dtype == "bytes" and spec.shape == ():
        return {"pythonClassName": _CLASSES + "text_feature.Text", "text": {}}
    shape = ["-1"] if spec.shape is None else [str(d) for d in spec.shape]
    return {
        "pythonClassName": _CLASSES + "tensor_feature.Tensor",
        "tensor": {
            "dtype": _DTYPES[spec.dtype],
            "encoding": "none",
            "shape": {"dimensions": shape} if shape else {},
        },
    }


def _escape(name: str) -> str:
    """tfds fills the template with ``str.format``: braces in the name stay literal."""
    return name.replace("{", "{{").replace("}", "}}")


def _json(doc: dict[str, Any], indent: int) -> bytes:
    return jsonfile.encode(doc, indent=indent)
