"""Errors raised inside tf.data, kept so a wrapper can raise them again as they were.

TensorFlow hands on an exception raised in a ``numpy_function`` or a generator as an
``OpError`` whose message quotes it (with the Python traceback). The code that raised
one of tfshards' own errors :meth:`Raised.keep`\\ s it; a wrapper around the iteration
(:func:`tfshards.reading.corruption.shard_errors`,
:func:`tfshards.reading.generator.file_errors`) finds it again by its message.
"""

from __future__ import annotations

import collections
import threading
from typing import Generic, TypeVar

from tfshards.errors import TfshardsError

E = TypeVar("E", bound=TfshardsError)

KEEP = 64  # the latest errors kept, by message: a pipeline raises one at a time


class Raised(Generic[E]):
    """The latest errors of one kind raised, by message, safe across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_message: collections.OrderedDict[str, E] = collections.OrderedDict()

    def keep(self, exc: E) -> None:
        """Remember ``exc`` (the oldest kept goes past :data:`KEEP`)."""
        with self._lock:
            self._by_message[exc.message] = exc
            while len(self._by_message) > KEEP:
                self._by_message.popitem(last=False)

    def quoted_in(self, message: str) -> E | None:
        """The latest kept error whose message ``message`` (TensorFlow's wrapping) quotes."""
        with self._lock:
            return next(
                (e for text, e in reversed(self._by_message.items()) if text in message), None
            )
