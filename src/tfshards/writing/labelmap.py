"""The pinned label map (``write.labels``): label names in id order, applied to a listing's rows.

A listing numbers its labels by sorted name, so a new class folder (``aardvark``)
shifts every id after it, and folders ``0..25`` sort as ``0, 1, 10, 11, ...``. With
a pinned map a label's id is its position in the map: the listing's ids are
translated once per entry where a shard reads its rows (:class:`RelabeledRows`),
before any source frames them, so the C framing path and a transform see the
pinned id. Labels in the map with no files keep their ids.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from tfshards.errors import ConfigError
from tfshards.listing.entry import Entry
from tfshards.listing.protocol import Rows

_NAMED = 5  # missing labels named in the error; the rest are counted


def parse_labels(text: str | None) -> tuple[str, ...] | None:
    """``--labels cat,dog,bird`` as names in id order; none, null or empty (DVC's None): None.

    Spaces around each name are dropped (``cat, dog`` is ``cat,dog``).
    """
    if text is None or text.strip().lower() in ("", "none", "null"):
        return None
    return tuple(name.strip() for name in text.split(","))


def check_labels(labels: Sequence[str]) -> tuple[str, ...]:
    """A pinned map as a tuple: at least one name, each a non-empty string, each once.

    Raises:
        ConfigError: one line naming the first empty or repeated name.
    """
    if isinstance(labels, str) or not labels:
        raise ConfigError(
            f"labels: expected a list of label names, got {labels!r}", option="labels"
        )
    names = tuple(labels)
    seen: set[str] = set()
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise ConfigError(
                f"labels: expected non-empty label names, got {name!r} at position {i}",
                option="labels",
            )
        if name in seen:
            raise ConfigError(
                f"labels: expected each label once, got {name!r} again at position {i} "
                f"(first at {names.index(name)})",
                option="labels",
            )
        seen.add(name)
    return names


def label_ids(listed: Sequence[str], pinned: Sequence[str]) -> tuple[int, ...]:
    """Each listed label's id in ``pinned`` (``listed`` in listing id order).

    Raises:
        ConfigError: a listed label is not pinned (one line naming the first few).
    """
    position = {name: i for i, name in enumerate(pinned)}
    missing = [name for name in listed if name not in position]
    if missing:
        named = ", ".join(repr(name) for name in missing[:_NAMED])
        more = f" and {len(missing) - _NAMED} more" if len(missing) > _NAMED else ""
        raise ConfigError(
            f"labels: the listing has labels the pinned label map (write.labels in "
            f"params.yaml, --labels) lacks: {named}{more}; append them to write.labels "
            f"(they get ids {len(pinned)} and up; never reorder the labels there)",
            option="labels",
            param="write.labels",
        )
    return tuple(position[name] for name in listed)


def relabel(rows: Rows, ids: Sequence[int]) -> Rows:
    """``rows`` with each entry's label id translated through ``ids``; as is when ids are 0, 1..."""
    if all(i == new for i, new in enumerate(ids)):
        return rows
    return RelabeledRows(rows, tuple(ids))


@dataclass(frozen=True)
class RelabeledRows:
    """:class:`Rows` whose entries carry the pinned label ids: ``ids[listing id]``.

    Plain picklable values (the rows and a tuple), so a shard task carries it to any worker.
    """

    rows: Rows
    ids: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.rows)

    def batches(self) -> Iterator[Sequence[Entry]]:
        ids = self.ids
        for batch in self.rows.batches():
            yield [Entry(path, size, ids[label], token) for path, size, label, token in batch]


def resolve(
    listed: Sequence[str],
    pinned: Sequence[str] | None,
    previous: Sequence[str] | None,
    relabel: bool,
) -> tuple[str, ...]:
    """TEMPORARY (replaced by the merge): pinned, else previous + new sorted, else listed."""
    if pinned is not None:
        return tuple(pinned)
    if previous is not None:
        return tuple(previous) + tuple(sorted(set(listed) - set(previous)))
    return tuple(listed)
