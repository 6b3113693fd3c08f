"""The optional C loops (``tfshards.format._native``), or ``None`` where they are not built.

``setup.py`` compiles ``_native*.c`` (one file per job, ``_native.c`` the
module table) when a C compiler and OpenSSL's headers are there; without
them the install goes on and every caller uses its pure-Python loop, which
writes the same bytes and finds the same problems (the tests run both).
``TFSHARDS_PURE_PYTHON=1`` forces the Python loops, in this process and in
the worker processes it starts.

The C loops release the GIL while they work, so threads run them in parallel.
``MISSING`` says why they are not there (``None`` when they are, or when the
Python loops were asked for); the command line says it once per run on stderr
(:func:`tfshards.cli._common.announce_python_loops`), the library never does.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Protocol, cast

Buffer = Any  # anything with the buffer protocol (bytes, bytearray, memoryview, numpy)


class Native(Protocol):
    """What the extension offers (``_native.c`` names the file of each; its comments say more)."""

    def frame_files(
        self,
        buffer: bytearray,
        used: int,
        dir_fd: int,
        rels: list[bytes],
        labels: list[int],
        sizes: list[int],
        start: int,
        keys: tuple[bytes, ...],
        roles: str,
        expected: bytes = ...,
        images: bytes = ...,
    ) -> tuple[int, int, int, Any]: ...

    def hash_files(self, folder: bytes, names: list[bytes]) -> tuple[bytes, bytes]: ...

    def stat_files(self, folder: bytes, names: list[bytes]) -> bytes: ...

    def frame_offsets(self, buffer: Buffer) -> tuple[bytes, int]: ...

    def scan_frames(self, buffer: Buffer) -> tuple[bytes, bytes, int]: ...

    def outline_examples(
        self, buffer: Buffer, starts: Buffer, ends: Buffer, keys: tuple[bytes, ...]
    ) -> tuple[bytes, bytes, bytes, bytes]: ...

    def hash_spans(self, buffer: Buffer, starts: Buffer, ends: Buffer) -> bytes: ...

    def image_headers(self, buffer: Buffer, starts: Buffer, ends: Buffer) -> bytes: ...

    def images_refused(self, buffer: Buffer, starts: Buffer, ends: Buffer) -> bytes: ...

    def image_records(
        self, buffer: Buffer, payload_key: bytes, path_key: bytes
    ) -> tuple[bytes, int]: ...

    def read_lines(self, idx_fd: int, lines_fd: int, indices: Buffer) -> tuple[bytes, int]: ...

    def match_members(
        self, listing: Buffer, files: int, keep: list[bytes], members: list[bytes]
    ) -> list[bytes | None] | None: ...


def _load() -> tuple[Native | None, str | None]:
    """The module, or None and why it is missing (none when the Python loops were asked for)."""
    if os.environ.get("TFSHARDS_PURE_PYTHON", "") not in ("", "0"):
        return None, None
    try:
        return cast(Native, importlib.import_module("tfshards.format._native")), None
    except ModuleNotFoundError:
        return None, "not installed"
    except ImportError as exc:  # built, but it cannot load here (a library it links is missing)
        return None, f"installed but cannot be loaded ({' '.join(str(exc).split())})"


NATIVE, MISSING = _load()
