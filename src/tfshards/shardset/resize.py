"""How a shard set's images were resized when written: the params its manifest records.

The writer resizes (:mod:`tfshards.writing.resize`); the loader reads these
params back to decode without resizing again (an image stored at the asked
size is decoded only). The params name the encoder and its version, so a new
Pillow names a new shard version.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tfshards.errors import ConfigError

FORMATS = ("jpeg", "raw")
JPEG_QUALITY = 90  # what photo data sets are stored at; 224 px synthetic images: ~9 KB
MAX_SIZE = 8192  # sides above this are no training size; the cap keeps a typo from using GBs


@dataclass(frozen=True)
class Resize:
    """Store images as ``size`` x ``size`` pixels in ``format`` (``jpeg`` or ``raw``)."""

    size: int
    format: str = "jpeg"

    def __post_init__(self) -> None:
        if not 1 <= self.size <= MAX_SIZE:
            raise ConfigError(
                f"resize: expected a side of 1..{MAX_SIZE} pixels, got {self.size}", option="resize"
            )
        if self.format not in FORMATS:
            raise ConfigError(
                f"resize_format: expected one of {FORMATS}, got {self.format!r}",
                option="resize_format",
                valid=FORMATS,
            )

    def params(self) -> dict[str, Any]:
        """What shapes the stored bytes, for the manifest and the version name."""
        doc: dict[str, Any] = {
            "encoder": f"pillow {_pillow_version()}",
            "filter": "bilinear",
            "format": self.format,
            "size": self.size,
        }
        if self.format == "jpeg":
            doc["quality"] = JPEG_QUALITY
        return doc

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Resize | None:
        """The resize a manifest's ``params`` record, or None for images stored as listed."""
        doc = params.get("resize")
        if not isinstance(doc, Mapping):
            return None
        return cls(int(doc["size"]), str(doc["format"]))


def _pillow_version() -> str:
    """The installed Pillow's version (its encoder shapes resized bytes); read on first use."""
    from importlib import metadata  # ~20 ms that a command's start need not pay

    return metadata.version("pillow")
