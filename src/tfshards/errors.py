"""Errors raised by tfshards, one tree so callers can catch what they can handle.

    TfshardsError                  base; the CLI prints the message on one line and exits 1
    ├── ConfigError                an option, parameter or spec is invalid
    ├── InputError                 a raw input is bad: root, index file, a listed file
    │   ├── TransformError         a user transform failed on one file
    │   │   └── TransformOutputError  what it returns can never be written: never skipped
    │   └── StaleListingError      the listing gives a file a digest its hash cache got wrong
    ├── ShardError                 a shard cannot be written, read or trusted (names the shard)
    │   └── RecordError            one record inside a shard is corrupt (shard, index, offset)
    ├── StorageError               remote storage cannot be reached or refuses access
    └── ValidationError            validation found problems (``problems`` holds each line)

Every error keeps its data as attributes as well as in the message, and pickles
with them, so an error raised inside a worker process reaches the parent whole.
Each class declares its attributes (typed, None when not given); the class,
never an attribute, says how a caller should react.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class TfshardsError(Exception):
    """Base class of every error tfshards raises on purpose."""

    def __init__(self, message: str, **attrs: Any) -> None:
        super().__init__(message)
        self.message = message
        for key, value in attrs.items():
            setattr(self, key, value)

    def __reduce__(self) -> tuple[Any, ...]:
        attrs = {k: v for k, v in self.__dict__.items() if k != "message"}
        return (_rebuild, (type(self), self.message, attrs))

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[TfshardsError], message: str, attrs: dict[str, Any]) -> TfshardsError:
    return cls(message, **attrs)


class ConfigError(TfshardsError, ValueError):
    """An option, parameter or spec is invalid; ``option`` names it where one is at fault."""

    option: str | None = None
    path: str | None = None  # the file that holds it (a params or dvc.yaml file)
    url: str | None = None  # a location no installed filesystem can reach
    step: str | None = None  # the set-up command that was skipped (``git init``)
    stage: str | None = None  # the DVC stage at fault
    param: str | None = None  # the ``section.key`` at fault
    model: str | None = None  # a model name that is unknown or cannot take the input
    valid: Sequence[str] | None = None  # the values that would have been accepted
    image_size: int | None = None
    min_image_size: int | None = None
    classes: int | None = None


class InputError(TfshardsError):
    """A raw input (root, index file, listed file) is missing, unreadable or malformed."""

    path: str | None = None  # the input at fault: a root, an index file, a listed file
    line: int | None = None  # 1-based line of ``path`` (index files, listings)
    file: str | None = None  # a listed file named on that line
    output: int | None = None  # which of a per-file function's outputs is wrong
    skipped: Mapping[str, int] | None = None  # entries skipped per reason, when none were left
    pattern: str | None = None  # a pattern the input failed to match (write.group_by)


class TransformError(InputError):
    """A user transform could not be loaded, or failed on one file (``on_error=skip`` skips it)."""

    transform: str | None = None  # its ``package.module:function``
    feature: str | None = None  # the feature at fault


class TransformOutputError(TransformError):
    """The transform returns what no file can make right (not a dict, a reserved name,
    a feature whose type changes): every file would fail, so it is never skipped."""


CHANGED_SINCE_LISTING = "file changed since it was listed"  # what its messages begin with


class ChangedSinceListingError(InputError):
    """A file's bytes are not those its listing saw (another size, hash or MD5): it changed
    after ``list``. Skipped under ``on_error: skip`` and read again by the next write."""


class StaleListingError(InputError):
    """The listing gives a file a SHA-256 that the hash cache remembered wrongly: the file did
    not change since it was listed (same stat), the listing did. Never skipped: re-run list."""

    cache: str | None = None  # the hash cache file that held the wrong digest


class ShardError(TfshardsError):
    """A shard cannot be written, read or trusted."""

    shard: str | None = None  # its file name
    shards: Sequence[str] | None = None  # several at once (those in flight when a worker died)
    path: str | None = None  # where it was read or written
    url: str | None = None  # where it was downloaded from
    found_sha256: str | None = None  # its content hash, when that is what is wrong
    errno: int | None = None  # the OS error of a failed write (ENOSPC, EFBIG, EROFS)


class RecordError(ShardError):
    """A record inside a shard is corrupt; ``shard``, ``index`` and ``offset`` say where."""

    index: int | None = None  # 0-based record number in the shard
    offset: int | None = None  # byte offset of the record


class StorageError(TfshardsError):
    """Remote storage cannot be reached (endpoint down) or refuses access (no credentials)."""


class ValidationError(TfshardsError):
    """Validation found problems; ``problems`` is the list of one-line descriptions."""

    problems: Sequence[str] | None = None
    problem_count: int | None = None  # all problems found (``problems`` keeps some)


def declared(cls: type[TfshardsError]) -> set[str]:
    """The attribute names ``cls`` and its bases declare (what its constructor may be given)."""
    return {name for klass in cls.__mro__ for name in getattr(klass, "__annotations__", {})}


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F]} | {
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
}


LONGEST_LINE = 2000  # characters of an error line; a value quoted whole was 778 KB once


def one_line(text: str) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\t``, ``\\x1b``): a file name
    holding a newline cannot split a message into lines that read as other messages.

    Cut in the middle to :data:`LONGEST_LINE` characters, saying how many went: a
    message quoting a bad value whole (a 50,000-column header, a 100,000-element
    path) is one line, not megabytes, and keeps its start (where) and end (why)."""
    line = text.translate(_CONTROL)
    if len(line) <= LONGEST_LINE:
        return line
    keep = (LONGEST_LINE - 40) // 2
    return f"{line[:keep]} ... ({len(line) - 2 * keep:,} characters) ... {line[-keep:]}"
