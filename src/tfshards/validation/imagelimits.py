"""The limits the image gates check (``validate.max_non_rgb_share``, ...), and their parsing.

Apart from :mod:`tfshards.validation.imagegates`, which reads the statistics,
so that the option table (and every ``--help``) imports no numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfshards.errors import ConfigError


@dataclass(frozen=True)
class ImageGates:
    """The gates; each is off at its default."""

    max_non_rgb_share: float = 1.0  # a side's share of images with other than 3 channels
    allowed_formats: tuple[str, ...] = ()  # empty: any
    fail_on_new_format: bool = False  # a format the previous version's side did not hold
    max_median_width_change: float = 0.0  # percent; 0: off

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_non_rgb_share <= 1.0:
            raise ConfigError(f"max_non_rgb_share must be in [0, 1], got {self.max_non_rgb_share}")
        if not self.max_median_width_change >= 0.0:
            raise ConfigError(
                f"max_median_width_change must be >= 0, got {self.max_median_width_change}"
            )


def parse_formats(text: str) -> tuple[str, ...]:
    """``JPEG,PNG`` (any case) as format names; ``any`` or empty: every format."""
    names = {"jpeg": "JPEG", "jpg": "JPEG", "png": "PNG", "gif": "GIF", "bmp": "BMP"}
    names["webp"] = "WebP"
    words = [w.strip().lower() for w in text.split(",") if w.strip()]
    if words in ([], ["any"]):
        return ()
    unknown = [w for w in words if w not in names]
    if unknown:
        raise ValueError(
            f"unknown image formats {unknown}: expected any, or some of {sorted(names)}"
        )
    return tuple(sorted({names[w] for w in words}))
