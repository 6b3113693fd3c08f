"""Leakage across shard sets: a file one set trains on that another set validates on.

``validate`` finds a payload on both sides of one set's split. Sets mixed for
training (:mod:`tfshards.reading.mixing`) can also leak into each other: the
same image in set A's validation side and in set B's training side scores
the model on what it trained on. This compares the content tokens of the
member lists (the listing's SHA-256 of each file, or the hash its object
store keeps), so no record is read; it holds one entry per validation record
and streams the training sides a member list at a time. Tokens of different
kinds never match: a file listed from a local folder in one set and from S3
in the other is not found.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tfshards import storage
from tfshards.shardset import members
from tfshards.shardset.manifest import Manifest, ShardInfo

Side = tuple[Manifest, Sequence[ShardInfo]]  # a set's manifest, and the shards of one side
EXAMPLES = 10  # leaks kept as examples; all are counted


@dataclass(frozen=True)
class Leak:
    """A file of set ``train_set``'s training side whose bytes set ``val_set`` validates on."""

    train_set: int
    train_path: str
    val_set: int
    val_path: str

    def line(self) -> str:
        return (
            f"set {self.train_set} trains on {self.train_path}, "
            f"which set {self.val_set} validates on as {self.val_path}"
        )


@dataclass(frozen=True)
class CrossLeaks:
    """How many training records of one set another set validates on, and a few of them."""

    count: int
    examples: tuple[Leak, ...]


def find(
    train: Sequence[Side], val: Sequence[Side], *, examples: int = EXAMPLES, **storage_options: Any
) -> CrossLeaks:
    """Training records of ``train[i]`` whose content ``val[j]`` validates on, for ``i != j``.

    ``train`` and ``val`` list the same sets in the same order (a set with no
    validation side passes no shards). Leaks within one set are ``validate``'s.

    Raises:
        InputError: a member list that is missing or does not match its shard.
    """
    validated: dict[str, dict[int, str]] = {}  # token -> {set: its first path with it}
    for j, (manifest, shards) in enumerate(val):
        for path, token in _rows(manifest, shards, **storage_options):
            validated.setdefault(token, {}).setdefault(j, path)
    count, found = 0, list[Leak]()
    for i, (manifest, shards) in enumerate(train):
        for path, token in _rows(manifest, shards, **storage_options):
            others = [j for j in validated.get(token, ()) if j != i]
            if others:
                count += 1
                if len(found) < examples:
                    found.append(Leak(i, path, min(others), validated[token][min(others)]))
    return CrossLeaks(count, tuple(found))


def _rows(
    manifest: Manifest, shards: Sequence[ShardInfo], **storage_options: Any
) -> Iterator[tuple[str, str]]:
    """``(path, token)`` of every record of ``shards``, one member list at a time."""
    fs, directory = storage.open_url(manifest.directory, **storage_options)
    for shard in shards:
        for row in members.load(fs, directory, shard):
            yield str(row[0]), str(row[1])
