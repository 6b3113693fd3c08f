"""The pinned label map (``write.labels``): label names in id order, applied to a listing's rows.

A listing numbers its labels by sorted name, so a new class folder (``aardvark``)
shifts every id after it, and folders ``0..25`` sort as ``0, 1, 10, 11, ...``. With
a pinned map a label's id is its position in the map: the listing's ids are
translated once per entry where a shard reads its rows (:class:`RelabeledRows`),
before any source frames them, so the C framing path and a transform see the
pinned id. Labels in the map with no files keep their ids.

:func:`resolve` picks a version's map: the pinned one (refused where it changes a
previous version's id, unless relabelled), else the previous version's with new
labels appended (a removed label's id is never reused), else the listing's. Folder
names that are all decimal numbers map to their number (``"k"`` gets id ``k``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

from tfshards.errors import ConfigError, InputError
from tfshards.listing.entry import Entry
from tfshards.listing.protocol import Rows

_NAMED = 5  # missing labels named in the error; the rest are counted
_MAX_NUMERIC = 100_000  # most ids a numeric map may hold
_SPARSE = 10  # a numeric map holds at most _SPARSE * labels + _SPARSE ids
_EXAMPLE = 4  # names shown in an example write.labels value
_RELABEL = "or accept the change with --relabel (params.yaml write.relabel: true)"


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


def resolve(
    listed: Sequence[str],
    pinned: Sequence[str] | None,
    previous: Sequence[str] | None,
    relabel: bool,
    previous_gaps: Collection[int] = (),
) -> tuple[str, ...]:
    """The new version's label names in id order (a label's id is its position).

    ``pinned`` (write.labels) is the map; else ``previous`` (the previous version's
    manifest labels) with the listed labels it lacks appended; else the ``listed``
    names sorted, or ``0..max`` where every one is a decimal number (its id).
    ``previous_gaps``: the ids of ``previous`` that are gaps (:func:`gap_ids`), which
    a new numeric folder of that number takes.

    Raises:
        ConfigError: one line: a listed label is not pinned; the pinned map changes a
            previous id and ``relabel`` is False; two numeric names of one number, or
            numbers too large for a map of them.
        InputError: a listed name holds a line break, or spaces at either end.
    """
    for name in listed:  # label.labels.txt holds one name a line, read back stripped
        if name != name.strip() or len(name.splitlines()) > 1:
            raise InputError(
                f"label {name!r}: expected a name without line breaks and without spaces at "
                "either end (tfds reads label.labels.txt a name a line, stripped); rename it"
            )
    if pinned is not None:
        names = check_labels(pinned)
        label_ids(listed, names)
        if previous and not relabel:
            _check_unchanged(previous, names)
        return names
    if previous:
        return _grown(listed, tuple(previous), frozenset(previous_gaps))
    by_value = _numbers(listed)
    if by_value is None:
        return tuple(sorted(set(listed)))
    return _numeric(by_value, listed)


def _check_unchanged(previous: Sequence[str], pinned: tuple[str, ...]) -> None:
    """Refuse a pinned map that moves or drops a label of ``previous`` (one line)."""
    position = {name: i for i, name in enumerate(pinned)}
    for old, name in enumerate(previous):
        new = position.get(name)
        if new == old:
            continue
        to = "no id (write.labels lacks it)" if new is None else f"id {new}"
        raise ConfigError(
            f"labels: write.labels moves label {name!r} from id {old} in the previous "
            f"version to {to}; ids must not change, since a model trained on the old ids "
            f"reads the new ones wrong; keep the previous labels in their order and "
            f"append new ones, {_RELABEL}",
            option="relabel",
            param="write.relabel",
        )


def _grown(
    listed: Sequence[str], previous: tuple[str, ...], previous_gaps: frozenset[int]
) -> tuple[str, ...]:
    """``previous`` with the listed labels it lacks appended; every old id kept.

    A numeric previous map (label ``k``'s number is ``k``) grows to ``0..m`` for
    a new number ``m``; other new labels follow, sorted. A new folder of number
    ``k`` takes id ``k`` where ``previous`` has a gap there (``previous_gaps``).
    """
    new = sorted(set(listed) - set(previous))
    if not new:
        return previous
    if any(not _digits(name) or int(name) != i for i, name in enumerate(previous)):
        return previous + tuple(new)
    numbered = [name for name in new if _digits(name)]
    rest = tuple(name for name in new if not _digits(name))
    if not numbered:
        return previous + rest
    previous = _filled(listed, previous, numbered, previous_gaps)
    numbered = [name for name in numbered if name not in previous]
    _check_renumbered(listed, previous, numbered)
    by_value = _numbers([*previous, *numbered])
    assert by_value is not None  # every name is digits
    return _numeric(by_value, [*previous, *numbered]) + rest


def gap_ids(
    labels: Sequence[str],
    listed: Sequence[str],
    previous: Sequence[str] | None,
    previous_gaps: Collection[int],
    pinned: bool,
) -> tuple[int, ...]:
    """The ids of ``labels`` that name no folder: ids between two folders' numbers in a
    numeric map, which :func:`_numeric` names ``str(k)`` (``03`` and ``07``: 4, 5, 6).

    Such an id is new in ``labels`` (past ``previous``) or one of ``previous_gaps``,
    and still no listed folder's name: a label removed from the folders keeps its id
    and is no gap, so no new folder takes it. A pinned map names every id. Kept in
    the manifest (``params["label_gaps"]``), so the next version knows them.
    """
    if pinned:
        return ()
    present, before = set(listed), len(previous or ())
    return tuple(
        k
        for k, name in enumerate(labels)
        if name == str(k) and name not in present and (k >= before or k in previous_gaps)
    )


def _filled(
    listed: Sequence[str],
    previous: tuple[str, ...],
    numbered: Sequence[str],
    previous_gaps: frozenset[int],
) -> tuple[str, ...]:
    """``previous`` with each gap a new numeric folder's number falls on named after it
    (``05`` takes id 5 where ``03`` and ``07`` left a gap). Another id of a previous
    label is a renamed folder's, which :func:`_check_renumbered` refuses."""
    names, present = list(previous), set(listed)
    for name in numbered:
        k = int(name)
        if k in previous_gaps and k < len(names) and names[k] not in present:
            names[k] = name
    return tuple(names)


def _check_renumbered(
    listed: Sequence[str], previous: Sequence[str], numbered: Sequence[str]
) -> None:
    """Refuse a new folder name with the number of a previous version's label (``0``
    where ``00`` was: the folders were renamed), saying how to rename the labels.

    Raises:
        ConfigError: naming both, and the pinned map with --relabel that renames them.
    """
    old = {int(name): name for name in previous}
    for name in numbered:
        was = old.get(int(name))
        if was is None:
            continue
        pinned = ",".join(_renamed(listed, previous))
        raise ConfigError(
            f"labels: folder {name!r} has the number of the previous version's label {was!r} "
            "(renamed folders?), so neither can be its id; to rename the labels, pin this "
            f"map, which keeps every other label's id: --labels {pinned} --relabel "
            "(params.yaml write.labels and write.relabel: true)",
            option="labels",
            param="write.labels",
        )


def _renamed(listed: Sequence[str], previous: Sequence[str]) -> list[str]:
    """``previous`` with each label no longer listed renamed, in place, to the new numeric
    folder of its number; the other new names appended (numbers first, then sorted)."""
    names = list(previous)
    at = {int(n): i for i, n in enumerate(previous) if _digits(n)}
    present = set(listed)
    new = sorted(present - set(previous), key=lambda n: (not _digits(n), _key(n)))
    for name in new:
        i = at.get(int(name)) if _digits(name) else None
        if i is not None and names[i] not in present:
            names[i] = name
        else:
            names.append(name)
    return names


def _key(name: str) -> tuple[int, str]:
    return (int(name), name) if _digits(name) else (0, name)


def _digits(name: str) -> bool:
    """``name`` is a decimal number: ASCII digits only (``007`` too)."""
    return name.isascii() and name.isdigit()


def _numbers(names: Sequence[str]) -> dict[int, str] | None:
    """Each number and its name when every name is a decimal number; None when one is not.

    ``007`` is 7: equal-width names (``00``..``25``) keep their spelling.

    Raises:
        ConfigError: two names of the same number (``7`` and ``007``).
    """
    if not all(_digits(name) for name in names):
        return None
    by_value: dict[int, str] = {}
    for name in sorted(set(names)):
        other = by_value.setdefault(int(name), name)
        if other != name:
            raise ConfigError(
                f"labels: folder names {other!r} and {name!r} are the same number, so "
                f"neither can be its id; {_pin_hint(names)}",
                option="labels",
                param="write.labels",
            )
    return by_value


def _numeric(by_value: dict[int, str], names: Sequence[str]) -> tuple[str, ...]:
    """The map ``0..max``: label of number ``k`` has id ``k`` (a gap is named ``str(k)``).

    Raises:
        ConfigError: more than 100,000 ids, or more than 10 ids per label (plus 10).
    """
    size = max(by_value, default=-1) + 1
    count = len(set(names))
    if size > _MAX_NUMERIC or size > _SPARSE * count + _SPARSE:
        raise ConfigError(
            f"labels: numeric folder names run up to {size - 1}, a map of {size} ids for "
            f"{count} labels; {_pin_hint(names)}",
            option="labels",
            param="write.labels",
        )
    return tuple(by_value.get(i, str(i)) for i in range(size))


def _pin_hint(names: Sequence[str]) -> str:
    """How to pin the map, with an example value built from ``names``."""
    ordered = sorted(set(names), key=lambda name: (not _digits(name), len(name), name))
    shown = ",".join(ordered[:_EXAMPLE]) + (",..." if len(ordered) > _EXAMPLE else "")
    return (
        f"pin the label map with write.labels in params.yaml or --labels (names in id "
        f"order, comma-separated), e.g. write.labels: {shown}"
    )


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
            yield [
                Entry(path, size, ids[label], token, values)
                for path, size, label, token, values in batch
            ]
