"""Write sample image trees (bundled digits, deterministic synthetic images) for tests and demos.

Both trees use the ImageFolder layout that :mod:`tfshards.listing.listing` reads: the
first directory level is the label. Output is byte-identical on every run for
the same arguments and the same numpy/Pillow versions (Pillow bundles the
JPEG and zlib encoders, so their output is pinned by the lock file).
"""

from __future__ import annotations

import colorsys
import importlib.resources
import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from tfshards import atomicfile, storage
from tfshards.errors import ConfigError
from tfshards.processes import cpu_count
from tfshards.progress import Progress
from tfshards.run import executor as executors

FORMATS = {"jpeg": ".jpg", "png": ".png"}
JPEG_QUALITY = 90  # typical of photo datasets; with the noise below gives ~4 KB at 96 px
PNG_COMPRESS_LEVEL = 6  # zlib's default; fixed so the bytes never depend on Pillow defaults
BATCH = 256  # most images per task: enough to hide pool overhead (~1 ms per 96 px image)

# Texture amplitudes, tuned so JPEG q90 files are ~4 KB at 96 px and ~70 KB at 512 px,
# close to photo datasets at those sizes (measured means: 3.96 KB and 72.9 KB, seed 0).
_FINE_NOISE = 7.5  # per-pixel noise, std in 0..255 levels
_BYTE_STD = 73.9  # std of uniform integers 0..255: sqrt((256**2 - 1) / 12)
_COARSE_NOISE = 24.0  # smooth blotches: std of a 12x12 grid upsampled to the image
_COARSE_GRID = 12


@dataclass(frozen=True)
class SyntheticSpec:
    """What one synthetic tree looks like; images depend only on ``(seed, index)``.

    Args:
        count: number of images, >= 1.
        size: width and height in pixels, >= 8.
        fmt: ``"jpeg"`` (quality 90) or ``"png"``.
        classes: number of classes, 1..1000; image ``i`` has class ``i % classes``.
        seed: seed of the whole tree.
    """

    count: int
    size: int
    fmt: str = "jpeg"
    classes: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ConfigError(f"count must be >= 1, got {self.count}")
        if self.size < 8:
            raise ConfigError(f"size must be >= 8 pixels, got {self.size}")
        if self.fmt not in FORMATS:
            raise ConfigError(f"format must be one of {sorted(FORMATS)}, got {self.fmt!r}")
        if not 1 <= self.classes <= 1000:
            raise ConfigError(f"classes must be in 1..1000, got {self.classes}")
        if self.seed < 0:
            raise ConfigError(f"seed must be >= 0, got {self.seed}")

    def relpath(self, index: int) -> str:
        """``<class>/<index>.<ext>``, zero-padded so that string order is numeric order."""
        label_width = max(2, len(str(self.classes - 1)))
        index_width = max(6, len(str(self.count - 1)))
        label = index % self.classes
        return f"{label:0{label_width}d}/{index:0{index_width}d}{FORMATS[self.fmt]}"


def render_synthetic(spec: SyntheticSpec, index: int) -> bytes:
    """Encode image ``index`` of ``spec``: a class-hued gradient, 2-4 ellipses and noise.

    The background hue is ``class / classes`` of the colour wheel, so a model can
    learn the class from colour; everything else is per-image noise drawn from
    ``numpy.random.default_rng([seed, index])``.
    """
    rng = np.random.default_rng([spec.seed, index])
    size = spec.size
    saturation, value = rng.uniform(0.55, 0.9, 2)
    hue = (index % spec.classes) / spec.classes
    base = np.array(colorsys.hsv_to_rgb(hue, saturation, value), dtype=np.float32) * 255
    axis = np.linspace(-0.5, 0.5, size, dtype=np.float32)
    angle, amplitude = rng.uniform(0, 2 * np.pi), rng.uniform(40, 90)
    gradient_x = (np.float32(np.cos(angle) * amplitude) * axis)[None, :, None]
    gradient_y = (np.float32(np.sin(angle) * amplitude) * axis)[:, None, None]
    img = np.broadcast_to(gradient_x + gradient_y + base, (size, size, 3)).copy()
    for _ in range(int(rng.integers(2, 5))):
        cx, cy = rng.uniform(-0.4, 0.4, 2)
        rx, ry = rng.uniform(0.08, 0.3, 2)
        colour = rng.uniform(0, 255, 3).astype(np.float32)
        mask = ((axis - cx) / rx)[None, :] ** 2 + ((axis - cy) / ry)[:, None] ** 2 <= 1
        img[mask] = img[mask] * 0.3 + colour * 0.7
    grid = rng.normal(128, _COARSE_NOISE, (_COARSE_GRID, _COARSE_GRID, 3))
    blotches = Image.fromarray(np.clip(grid, 0, 255).astype(np.uint8), "RGB")
    img += np.asarray(blotches.resize((size, size), Image.Resampling.BILINEAR), dtype=np.float32)
    # Uniform byte noise: 3-5x cheaper to draw than Gaussian, and JPEG sizes only see its std.
    noise = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    img += noise * np.float32(_FINE_NOISE / _BYTE_STD)
    img -= np.float32(128 + 127.5 * _FINE_NOISE / _BYTE_STD)  # centre blotches and noise on 0
    return _encode(np.clip(img, 0, 255).astype(np.uint8), spec.fmt)


def _encode(pixels: np.ndarray[Any, Any], fmt: str) -> bytes:
    buf = io.BytesIO()
    mode = "L" if pixels.ndim == 2 else "RGB"
    image = Image.fromarray(pixels, mode)
    if fmt == "jpeg":
        # Baseline, no optimize/progressive/EXIF: the encoder output is a pure function of pixels.
        image.save(buf, "JPEG", quality=JPEG_QUALITY, optimize=False, progressive=False)
    else:
        image.save(buf, "PNG", compress_level=PNG_COMPRESS_LEVEL, optimize=False)
    return buf.getvalue()


@dataclass(frozen=True)
class SyntheticBatch:
    """One unit of parallel work: images ``start .. stop-1`` of ``spec`` under ``out_dir``."""

    spec: SyntheticSpec
    out_dir: str
    start: int
    stop: int


def write_synthetic_batch(batch: SyntheticBatch) -> tuple[int, int]:
    """Render and write one batch; returns ``(images, bytes)`` written."""
    fs, base = storage.open_url(batch.out_dir)
    nbytes = 0
    for index in range(batch.start, batch.stop):
        data = render_synthetic(batch.spec, index)
        nbytes += atomicfile.write_atomic(fs, storage.join(base, batch.spec.relpath(index)), [data])
    return batch.stop - batch.start, nbytes


def write_synthetic(
    out_dir: str,
    count: int,
    size: int,
    *,
    fmt: str = "jpeg",
    classes: int = 10,
    seed: int = 0,
    workers: int | None = None,
    progress: bool = False,
) -> int:
    """Write ``count`` synthetic ``size`` x ``size`` images as ``OUT/<class>/<index>.<ext>``.

    Image ``i`` has class ``i % classes`` (so classes are balanced) and bytes that
    depend only on ``(seed, i, size, fmt, classes)``: any worker count gives the
    same tree. Existing files with the same names are replaced; other files in
    ``out_dir`` are left alone (DVC removes a stage's outputs before running it).

    Args:
        out_dir: local directory or fsspec URL; created if missing. Non-local
            filesystems are written from this process (``workers`` is ignored).
        count: number of images.
        size: width and height in pixels.
        fmt: ``"jpeg"`` (``.jpg``, quality 90) or ``"png"``.
        classes: number of classes (label folders ``00``, ``01``, ...).
        seed: seed of the whole tree.
        workers: processes to render with; default all cores.
        progress: show a progress bar / log lines on stderr.

    Returns:
        The number of images written.
    """
    spec = SyntheticSpec(count=count, size=size, fmt=fmt, classes=classes, seed=seed)
    if workers is not None and workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    fs, _ = storage.open_url(out_dir)
    n_workers = (workers if workers is not None else cpu_count()) if storage.is_local(fs) else 1
    step = max(1, min(BATCH, -(-count // (4 * n_workers))))  # >= 4 batches per worker
    batches = [
        SyntheticBatch(spec, out_dir, start, min(start + step, count))
        for start in range(0, count, step)
    ]
    with Progress("synthetic", total=count, unit="img", enabled=progress) as bar:
        for done, nbytes in _run(batches, n_workers):
            bar.update(done, nbytes)
    return count


def _run(batches: list[SyntheticBatch], workers: int) -> Iterator[tuple[int, int]]:
    options = executors.RunOptions(workers, "process" if workers > 1 else "serial")
    with executors.start(options, tasks=len(batches)) as pool:
        for _, done in pool.map(write_synthetic_batch, batches):
            yield done


DIGITS_FILE = "digits.txt"
_INTENSITY = {c: v for v, c in enumerate("0123456789abcdefg")}


def read_digits() -> tuple[np.ndarray, np.ndarray]:
    """The bundled digits: labels ``(1797,)`` and 0..16 intensities ``(1797, 8, 8)``."""
    text = (importlib.resources.files(__package__) / DIGITS_FILE).read_text("ascii")
    rows = [line.split(" ") for line in text.splitlines() if not line.startswith("#")]
    labels = np.array([int(label) for label, _ in rows], dtype=np.int64)
    flat = [[_INTENSITY[c] for c in pixels] for _, pixels in rows]
    return labels, np.array(flat, dtype=np.uint8).reshape(len(rows), 8, 8)


def write_digits(out_dir: str) -> int:
    """Write the bundled handwritten digits (``digits.txt`` beside this module, the copy
    scikit-learn's ``load_digits()`` returns) as ``OUT/<digit>/<id>.png``.

    1,797 grayscale images in 10 classes (``"0"`` .. ``"9"``), no download. The
    images stay at their native 8 x 8 pixels (upscaling would add no information,
    only bytes); the 0..16 intensities are scaled to 0..255 with rounding. ``id``
    is the image's line among the file's images, zero-padded to five digits.

    Args:
        out_dir: local directory or fsspec URL; created if missing.

    Returns:
        The number of images written (1797).
    """
    labels, intensities = read_digits()
    images = np.rint(intensities.astype(np.float64) * (255.0 / 16.0))
    pixels = np.clip(images, 0, 255).astype(np.uint8)
    fs, base = storage.open_url(out_dir)
    for i, (image, label) in enumerate(zip(pixels, labels, strict=True)):
        path = storage.join(base, str(int(label)), f"{i:05d}.png")
        atomicfile.write_atomic(fs, path, [_encode(image, "png")])
    return len(labels)
