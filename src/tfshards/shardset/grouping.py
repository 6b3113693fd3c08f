"""Group keys of listed files: a regex over the path relative to the root.

The pattern is checked with Python's ``re`` and matched with the ``regex``
module in its ``re``-compatible mode (VERSION0), which alone can stop a match:
``re`` has no time limit, and a pattern with nested quantifiers backtracks
exponentially on a crafted name (``^(.*?,){11}P`` over ``1,`` x 30 + ``.jpg``:
8.6 s in ``re``, minutes at 40 commas). Each path gets :data:`MATCH_SECONDS`.
The two differ only on syntax ``re`` reads otherwise: POSIX classes
(``[[:digit:]]``, a set plus a FutureWarning in ``re``) and fuzzy matching
(``(?:ab){e<=1}``, literal text in ``re``).
"""

from __future__ import annotations

import functools
import re
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from tfshards.errors import ConfigError, InputError

NONE = "none"  # the param value that means no grouping
_RESERVED = "column:"  # kept for index-file columns: never read as a regex
# A path matches in 1-3 us (1M paths, typical patterns, 2-core VM); a second on one
# path is backtracking that a longer name makes take minutes, not a slow pattern.
MATCH_SECONDS = 1.0
# Each file's group id (listing order) and the number of groups.
Groups: TypeAlias = "tuple[array[int], int]"


@dataclass(frozen=True)
class GroupBy:
    """Which group a file belongs to: the first capture group of ``pattern`` (else the match).

    Searched for (as ``re.search`` does) in the path relative to the listing root
    (``/``-separated), so the pattern is anchored only where it says ``^`` or ``$``.
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
    def _search(self) -> Callable[..., Any]:
        import regex  # 150 ms to import: only a grouped write or check pays

        try:
            return regex.compile(self.pattern, regex.VERSION0).search  # type: ignore[no-any-return]
        except regex.error as exc:
            raise ConfigError(f"group_by: '{self.pattern}' is not a valid regex ({exc})") from None

    @classmethod
    def parse(cls, value: str | None) -> GroupBy | None:
        """None for ``None``, ``""`` or ``none`` (any case); else the checked pattern."""
        if value is None or not value.strip() or value.strip().lower() == NONE:
            return None
        return cls(value)

    def match(self, path: str) -> Any:
        """The pattern's match in ``path`` (a ``regex`` match object), or None.

        Raises:
            InputError: the match took over :data:`MATCH_SECONDS`.
        """
        try:
            return self._search(path, timeout=MATCH_SECONDS)
        except TimeoutError:
            raise self.too_slow(path, path) from None

    def too_slow(self, path: str, where: str) -> InputError:
        """The one-line error for a path the pattern took too long on; ``where`` names it."""
        return InputError(
            f"{where}: group_by '{self.pattern}' took over {MATCH_SECONDS:g} s to match "
            f"{path!r}: the pattern backtracks without end on it (nested quantifiers such "
            "as (a+)+ or (.*?,){11}); simplify it",
            path=where,
            pattern=self.pattern,
        )

    def key(self, path: str) -> str | None:
        """``path``'s group, or None when the pattern does not match it or its capture
        group 1 did not take part in the match.

        Raises:
            InputError: the match took over :data:`MATCH_SECONDS` (asked again for
                the same path, at once).
        """
        last = self._last
        if last[0][0] == path:
            found = last[0][1]
            if isinstance(found, InputError):
                raise found
            return found
        try:
            match = self.match(path)
        except InputError as exc:
            last[0] = (path, exc)
            raise
        key = None if match is None else match.group(1) if match.re.groups else match.group(0)
        last[0] = (path, key)
        return key

    @functools.cached_property
    def _last(self) -> list[tuple[str | None, str | InputError | None]]:
        """The last path asked and its key (or its timeout): validate asks twice per
        record (its group tally and the rule that it has one), and a match costs ~3 us
        (``regex`` with a timeout; ``re`` without: 0.6 us)."""
        return [(None, None)]

    def miss(self, path: str) -> str:
        """Why ``path`` has no group, for a message: found no match, or matched without group 1."""
        found = self.match(path)
        if found is None:
            return "found no match"
        return f"matched {found.group(0)!r}, but capture group 1 did not participate"

    def no_match(self, path: str, root: str) -> InputError:
        """The one-line error for a listed file the pattern gives no group."""
        where = f"{root.rstrip('/')}/{path}"
        return InputError(
            f"{where}: expected its path {path!r} to match group_by '{self.pattern}', "
            f"{self.miss(path)}: widen the pattern (e.g. '^([^/]+/[^_]+)_' groups "
            "label/subject_*.jpg by subject)",
            path=where,
            pattern=self.pattern,
        )


def group_ids(group_by: GroupBy, paths: Iterable[str], root: str) -> tuple[array[int], int]:
    """Each path's group id (4 bytes per path) and the number of groups.

    Ids number the distinct keys in sorted order, so they depend only on the
    set of paths. Holds one string per group, never one per path.

    Raises:
        InputError: a path the pattern gives no group (the first, in listing order), or
            one it takes over :data:`MATCH_SECONDS` to match.
    """
    first_seen: dict[str, int] = {}
    ids = array("I")
    for path in paths:
        try:
            key = group_by.key(path)
        except InputError:
            raise group_by.too_slow(path, f"{root.rstrip('/')}/{path}") from None
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
