"""Group keys of listed files: a regex over the path relative to the root."""

from __future__ import annotations

import functools
import re
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeAlias

from tfshards.errors import ConfigError, InputError
from tfshards.listing import Listing
from tfshards.storedlisting import StoredListing

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
            raise ConfigError(f"group_by: expected a regex, got {self.pattern!r}")
        if self.pattern.startswith(_RESERVED):
            raise ConfigError(
                f"group_by: expected a regex over the path, got {self.pattern!r}: "
                "index-file columns are not supported yet; group by a part of the path"
            )
        try:
            re.compile(self.pattern)
        except re.error as exc:
            raise ConfigError(f"group_by: {self.pattern!r} is not a valid regex ({exc})") from None

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
        return InputError(
            f"{path}: group_by {self.pattern!r} does not match this path (relative to "
            f"{root}): expected every listed path to match; widen the pattern "
            "(e.g. '^([^/]+/[^_]+)_' groups label/subject_*.jpg by subject)",
            path=path,
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


def read_groups(listing: Listing | StoredListing, group_by: str | None) -> Groups | None:
    """The files' group ids under ``group_by`` (None without it): one pass over the paths.

    Raises:
        InputError: a listed path the pattern does not match.
    """
    parsed = GroupBy.parse(group_by)
    if parsed is None:
        return None
    if isinstance(listing, StoredListing):
        return group_ids(parsed, listing.paths(), listing.root)
    return group_ids(parsed, (e.path for e in listing.entries), listing.root)
