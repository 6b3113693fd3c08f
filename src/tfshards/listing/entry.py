"""One listed file: the row every stage from the walker to the shard writer passes on."""

from __future__ import annotations

from typing import Any, NamedTuple


class Entry(NamedTuple):
    """One listed file."""

    path: str  # relative to the root, posix separators
    size: int  # bytes
    label: int  # index into the listing's labels
    token: str  # content token (tfshards.listing.contenthash): "sha256:<hex>", "etag:<etag>", ...
    values: dict[str, Any] | None = None  # extra columns (tfshards.format.columns) by name
