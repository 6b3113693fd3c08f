"""Group keys of listed files: a regex over the path relative to the root."""

from __future__ import annotations

import functools
import re
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from tfshards.errors import ConfigError, InputError

NONE = "none"  # the param value that means no grouping
_RESERVED = "column:"  # kept for index-file columns: never read as a regex
# Each file's group id (listing order) and the number of groups.
Groups: TypeAlias = "tuple[array[int], int]"


@dataclass(frozen=True)
class GroupBy:
    """Which group a file belongs to: the first capture group of ``pattern`` (else the match).

    ``re.search`` over the path relative to the listing root (``/``-separated),
    so the pattern is anchored only where it says ``^`` or ``$``.
    """

    pattern: str

    def __post_init__(self) -> None:
        if not self.pattern or self.pattern.lower() == NONE:
            raise ConfigError(f"group_by: expected a regex, got '{self.pattern}'")
        if self.pattern.startswith(_RESERVED):
            raise ConfigError(
                f"group_by: expected a regex over the path, got '{self.pattern}': "
                "index-file columns are not supported yet; group by a part of the path"
            )
        try:
            re.compile(self.pattern)
        except re.error as exc:
            raise ConfigError(f"group_by: '{self.pattern}' is not a valid regex ({exc})") from None

    @functools.cached_property
    def _search(self) -> Callable[[str], re.Match[str] | None]:
        return re.compile(self.pattern).search

    @classmethod
    def parse(cls, value: str | None) -> GroupBy | None:
        """None for ``None``, ``""`` or ``none`` (any case); else the checked pattern."""
        if value is None or not value.strip() or value.strip().lower() == NONE:
            return None
        return cls(value)

    def key(self, path: str) -> str | None:
        """``path``'s group, or None when the pattern does not match it."""
        match = self._search(path)
        if match is None:
            return None
        return match.group(1) if match.re.groups else match.group(0)

    def no_match(self, path: str, root: str) -> InputError:
        """The one-line error for a listed file the pattern does not match."""
        where = f"{root.rstrip('/')}/{path}"
        return InputError(
            f"{where}: expected its path {path!r} to match group_by '{self.pattern}', "
            "found no match: widen the pattern (e.g. '^([^/]+/[^_]+)_' groups "
            "label/subject_*.jpg by subject)",
            path=where,
            pattern=self.pattern,
        )


def group_ids(group_by: GroupBy, paths: Iterable[str], root: str) -> tuple[array[int], int]:
    """Each path's group id (4 bytes per path) and the number of groups.

    Ids number the distinct keys in sorted order, so they depend only on the
    set of paths. Holds one string per group, never one per path.

    Raises:
        InputError: a path the pattern does not match (the first, in listing order).
    """
    first_seen: dict[str, int] = {}
    ids = array("I")
    for path in paths:
        key = group_by.key(path)
        if key is None:
            raise group_by.no_match(path, root)
        ids.append(first_seen.setdefault(key, len(first_seen)))
    rank = array("I", bytes(4 * len(first_seen)))
    for r, (_, seen) in enumerate(sorted(first_seen.items())):
        rank[seen] = r
    return array("I", (rank[i] for i in ids)), len(first_seen)


@dataclass(frozen=True)
class Spread:
    """How a shard set's groups lie across its shards (what validate reports).

    Attributes:
        groups: distinct groups found.
        spanning: groups with records in more than one shard (0 when written with ``group_by``).
        example: one spanning group and the first two shards holding it, or None.
    """

    groups: int = 0
    spanning: int = 0
    example: tuple[str, str, str] | None = None

    def metrics(self) -> dict[str, int]:
        return {"groups": self.groups, "spanning_shards": self.spanning}


def spread(names: Sequence[str], keys: Sequence[Sequence[str]]) -> Spread:
    """Count groups whose records are in more than one shard; ``keys[k]``: shard ``names[k]``'s.

    Holds one entry per distinct group (its first shard), never one per record.
    """
    first: dict[str, int] = {}
    spanning: set[str] = set()
    example = None
    for k, shard_keys in enumerate(keys):
        for key in shard_keys:
            where = first.setdefault(key, k)
            if where != k:
                if example is None:
                    example = (key, names[where], names[k])
                spanning.add(key)
    return Spread(len(first), len(spanning), example)
