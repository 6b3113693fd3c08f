"""Which files a listing keeps: by suffix and by glob; the default suffixes (common images)."""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tfshards.errors import ConfigError

DEFAULT_EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp")


@dataclass(frozen=True)
class TreeFilter:
    """Which files to keep: by lower-case suffix (``None`` keeps all) and ``fnmatch`` glob."""

    extensions: frozenset[str] | None
    glob: str | None

    def __post_init__(self) -> None:
        for ext in self.extensions or ():
            if not ext.startswith(".") or ext != ext.lower() or "/" in ext:
                raise ConfigError(f"extension {ext!r}: expected lower case with a leading dot")
            if "." in ext[1:] or "*" in ext or "?" in ext:  # a name's last suffix is matched
                raise ConfigError(
                    f"extension {ext!r}: expected one suffix (.jpg), found "
                    f"{'a pattern' if '*' in ext or '?' in ext else 'several'}: a file's last "
                    "suffix is matched, so it would keep nothing; use --glob for patterns"
                )

    @classmethod
    def build(cls, extensions: Sequence[str] | None, glob: str | None) -> TreeFilter:
        """Normalize user input: ``"JPG"`` and ``".jpg"`` both mean ``.jpg``; empty keeps all."""
        if isinstance(extensions, str):
            extensions = extensions.split(",")
        exts = {"." + e.strip().lower().lstrip(".") for e in extensions or () if e.strip()}
        keep_all = not exts or ".*" in exts  # "*" (or nothing) keeps every file
        return cls(None if keep_all else frozenset(exts), glob or None)

    @functools.cached_property
    def _match(self) -> Callable[[str], Any] | None:
        return re.compile(fnmatch.translate(self.glob)).match if self.glob else None

    def reason(self, rel: str) -> str | None:
        """Why ``rel`` is skipped (``"extension"`` or ``"glob"``), or None to keep it."""
        if self.extensions is not None:
            name = rel[rel.rfind("/") + 1 :]
            dot = name.rfind(".")
            if dot <= 0 or name[dot:].lower() not in self.extensions:
                return "extension"
        if self._match is not None and not self._match(rel):
            return "glob"
        return None

    def describe(self) -> str:
        """``"kept: extensions .jpg,.png, glob '*/a*'"`` (no glob: none said), for errors."""
        exts = ",".join(sorted(self.extensions)) if self.extensions is not None else "any"
        return f"kept: extensions {exts}" + (f", glob {self.glob!r}" if self.glob else "")
