"""The same data set built with tensorflow-datasets: a GeneratorBasedBuilder over a local folder.

Fair to tfds on purpose: ``tfds.features.Image(encoding_format="jpeg")`` stores
the JPEG bytes it is given as they are (no re-encoding), and the records carry
the same four features tfshards writes (image, label, path, sha256). Nothing
is downloaded: ``_split_generators`` reads the files of a tfshards listing.
Statistics are not computed (tfds' default, ``ComputeStatsMode.SKIP``), and
the shard count is set to tfshards' 16 so readers get the same parallelism.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import tensorflow_datasets as tfds
from absl import logging as absl_logging
from etils import epath  # type: ignore[import-untyped]

from tfshards.listing.listing import Listing


class BenchImages(tfds.core.GeneratorBasedBuilder):  # type: ignore[misc]
    """Images in class folders, read from ``listing`` (passed at construction)."""

    VERSION = tfds.core.Version("1.0.0")
    # tfds 4.9.10 finds a builder's source through `importlib_resources`, which it
    # imports but does not require on Python >= 3.9; naming the file avoids that.
    code_path = epath.Path(__file__)

    def __init__(self, *, listing: Listing, **kwargs: Any) -> None:
        self._listing = listing
        super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(encoding_format="jpeg"),
                    "label": tfds.features.ClassLabel(names=list(self._listing.labels)),
                    "path": tfds.features.Text(),
                    "sha256": tfds.features.Text(),
                }
            ),
            supervised_keys=("image", "label"),
        )

    def _split_generators(self, dl_manager: Any) -> dict[str, Iterator[tuple[str, Any]]]:
        return {"train": self._generate_examples()}

    def _generate_examples(self) -> Iterator[tuple[str, dict[str, Any]]]:
        root = self._listing.root
        for entry in self._listing.entries:
            with open(os.path.join(root, entry.path), "rb") as f:
                data = f.read()
            yield (
                entry.path,
                {
                    "image": data,
                    "label": entry.label,
                    "path": entry.path,
                    "sha256": hashlib.sha256(data).hexdigest(),
                },
            )


def build(listing: Listing, data_dir: str, num_shards: int) -> BenchImages:
    """``download_and_prepare`` into ``data_dir`` (tfrecord files, ``num_shards`` of them)."""
    tfds.disable_progress_bar()
    absl_logging.set_verbosity(absl_logging.WARNING)
    builder = BenchImages(listing=listing, data_dir=data_dir, file_format="tfrecord")
    config = tfds.download.DownloadConfig(
        try_download_gcs=False, num_shards=min(num_shards, len(listing.entries))
    )
    with contextlib.redirect_stdout(sys.stderr):  # its "Downloading and preparing" lines
        builder.download_and_prepare(download_config=config)
    return builder
