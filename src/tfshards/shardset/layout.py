"""What a version directory holds: shards and the manifest on top, bookkeeping in subfolders.

The top level holds only ``<name>-NNNNN-of-NNNNN.tfrecord`` shards,
``manifest.json`` and the TensorFlow Datasets metadata (:data:`TFDS_FILES`),
so the globs readers use (``name-*``, ``name-*-of-*``, ``*.tfrecord*``;
TensorFlow's glob also matches hidden files) find shards and nothing else.
Everything else kept per shard (record index files, resume records, temp files
while a shard is written) lives in a subfolder those globs do not reach.
The writer, the validator and ``prune`` all read this one declaration: to keep
another per-shard file, add a :class:`Companion` to :data:`COMPANIONS`.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass

from tfshards import storage
from tfshards.errors import ConfigError

MANIFEST_NAME = "manifest.json"
# Perceptual hashes that versions written before validate.near_duplicates (which keeps them
# in the user's cache) held beside the manifest: still theirs, so prune removes them.
PHASH_NAME = "phash.bin"
WORK_DIR = "_work"  # resume records and shard temp files (never a shard glob's match)
# Written by prune on an object store before it deletes a version's manifest: a folder
# left with it and no manifest is a delete a kill interrupted, which the next prune
# finishes (on a local disk prune renames the folder away instead: tfshards.project.prune).
DELETING = f"{WORK_DIR}/deleting"


@dataclass(frozen=True)
class Companion:
    """A per-shard file: ``<folder>/<shard name><suffix>`` inside the version directory."""

    folder: str
    suffix: str

    def __post_init__(self) -> None:
        if not self.folder or "/" in self.folder or self.folder.startswith("."):
            raise ConfigError(f"companion folder must be one plain name, got {self.folder!r}")
        if not self.suffix:
            raise ConfigError("companion suffix must be non-empty")

    def path(self, shard: str) -> str:
        """Its path relative to the version directory."""
        return f"{self.folder}/{shard}{self.suffix}"


SIDECAR = Companion(WORK_DIR, ".done")  # the JSON record of a finished, hashed shard
INDEX = Companion("index", ".idx")  # "offset size" per record, as tfrecord2idx writes it
# Each record's listing key, content token and label id, in record order: one JSON
# array per line (tfshards.shardset.members). What a later version reuses or rewrites
# this shard by, and what ``tfshards diff`` compares, without reading a record.
RECORDS = Companion("records", ".jsonl")
STATS = Companion("imagestats", ".json")  # its images' statistics (tfshards.shardset.imagestats)
COMPANIONS: tuple[Companion, ...] = (SIDECAR, INDEX, RECORDS, STATS)
IMAGESTATS_NAME = "imagestats.json"  # the version's image statistics, per split bucket
# What tfds.builder_from_directory reads (tfshards.shardset.datasetinfo writes them).
TFDS_FILES = ("dataset_info.json", "features.json", "label.labels.txt")
FOLDERS = frozenset(c.folder for c in COMPANIONS) | {WORK_DIR}


def expected_paths(shards: Iterable[str]) -> set[str]:
    """Every file a finished version directory may hold, relative to it."""
    names = list(shards)
    companions = (c.path(s) for s in names for c in COMPANIONS)
    own = {MANIFEST_NAME, IMAGESTATS_NAME, PHASH_NAME, DELETING, *TFDS_FILES, *names}
    return own | set(companions)


def enclosing_version(url: str) -> str | None:
    """The version directory ``url`` (a local path or ``file://`` URL) lies in: the first
    folder above it holding a manifest and the ``_work/`` folder every writer makes; None
    when there is none (or ``url`` is on another store). A file an output put in one made
    that version fail ``validate`` ("file not listed in the manifest")."""
    fs, path = storage.open_url(url)
    if not storage.is_local(fs):
        return None
    folder = os.path.dirname(os.path.realpath(path))
    while True:
        if os.path.isfile(os.path.join(folder, MANIFEST_NAME)) and os.path.isdir(
            os.path.join(folder, WORK_DIR)
        ):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def refuse_in_version(url: str, option: str, read: str | None = None) -> None:
    """Refuse an output ``url`` inside any version directory (:func:`enclosing_version`),
    or inside ``read``, the version the command reads, on any store.

    Raises:
        ConfigError: one line naming the output, the version folder and the option.
    """
    version = enclosing_version(url)
    if version is None and read is not None and storage.inside(url, read):
        version = read
    if version is not None:
        raise ConfigError(
            f"{url}: expected a path outside every shard version folder, found it inside "
            f"{version} (a file there fails that version's validate): pass another {option}",
            option=option.removeprefix("--").replace("-", "_"),
        )


def work_dir(version: str) -> str:
    """The folder where shard temp files are written before they are moved into place."""
    return posixpath.join(version.rstrip("/"), WORK_DIR)


def sidecar_path(version: str, shard: str) -> str:
    """Where the resume record of ``shard`` lives."""
    return posixpath.join(version.rstrip("/"), SIDECAR.path(shard))


def index_path(version: str, shard: str) -> str:
    """Where the record index of ``shard`` lives."""
    return posixpath.join(version.rstrip("/"), INDEX.path(shard))


def stats_path(version: str, shard: str) -> str:
    """Where the image statistics of ``shard`` live."""
    return posixpath.join(version.rstrip("/"), STATS.path(shard))


def records_path(version: str, shard: str) -> str:
    """Where the member list of ``shard`` lives."""
    return posixpath.join(version.rstrip("/"), RECORDS.path(shard))


# What :func:`shard_name` makes, read back: prefix, index and count (5 digits or more).
SHARD_NAME = re.compile(
    r"(?P<prefix>[^/\\]+)-(?P<index>[0-9]{5,})-of-(?P<count>[0-9]{5,})\.tfrecord"
)


def shard_name(name: str, index: int, count: int) -> str:
    """``<name>-00003-of-00016.tfrecord``, the layout TFDS made familiar."""
    return f"{name}-{index:05d}-of-{count:05d}.tfrecord"
