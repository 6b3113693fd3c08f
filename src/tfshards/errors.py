"""Errors raised by tfshards, one tree so callers can catch what they can handle.

    TfshardsError                  base; the CLI prints the message on one line and exits 1
    ├── ConfigError                an option, parameter or spec is invalid
    ├── InputError                 a raw input is bad: root, index file, a listed file
    │   └── TransformError         a user transform failed or returned an unsupported value
    ├── ShardError                 a shard cannot be written, read or trusted (names the shard)
    │   └── RecordError            one record inside a shard is corrupt (shard, index, offset)
    ├── StorageError               remote storage cannot be reached or refuses access
    └── ValidationError            validation found problems (``problems`` holds each line)

Every error keeps its data as attributes as well as in the message, and pickles
with them, so an error raised inside a worker process reaches the parent whole.
"""

from __future__ import annotations

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
    """An option, parameter or spec is invalid."""


class InputError(TfshardsError):
    """A raw input (root, index file, listed file) is missing, unreadable or malformed."""


class TransformError(InputError):
    """A user transform could not be loaded, raised, or returned an unsupported value."""


class ShardError(TfshardsError):
    """A shard cannot be written, read or trusted."""


class RecordError(ShardError):
    """A record inside a shard is corrupt; ``shard``, ``index`` and ``offset`` say where."""


class StorageError(TfshardsError):
    """Remote storage cannot be reached (endpoint down) or refuses access (no credentials)."""


class ValidationError(TfshardsError):
    """Validation found problems; ``problems`` is the list of one-line descriptions."""
