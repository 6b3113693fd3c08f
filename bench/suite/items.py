"""The per-item functions of the generator section: what a user's own module would hold.

Kept apart from the benchmark code so a worker process that imports them
(``from_files`` in ``processes`` mode) loads only numpy and Pillow.
"""

from __future__ import annotations

import io
import time
from typing import Any

import numpy as np
from PIL import Image

RESIZE = (64, 64)
PYTHON_LOOP = 6_000  # iterations giving ~0.5 ms of CPython per item on the 2-core bench machine
SLEEP_S = 0.002


def pil_resize(path: str, label: int = 0) -> np.ndarray[Any, Any]:
    """Decode a JPEG with Pillow and resize it to ``RESIZE``: uint8 (64, 64, 3)."""
    with open(path, "rb") as f:
        data = f.read()
    image = Image.open(io.BytesIO(data)).convert("RGB")
    return np.asarray(image.resize(RESIZE, Image.Resampling.BILINEAR))


def python_loop(path: str, label: int = 0) -> np.ndarray[Any, Any]:
    """~0.5 ms of pure-Python arithmetic seeded by the path: int64 (1,)."""
    acc = len(path)
    for i in range(PYTHON_LOOP):
        acc = (acc * 31 + i) % 1_000_003
    return np.array([acc], dtype=np.int64)


def sleep_io(path: str, label: int = 0) -> np.ndarray[Any, Any]:
    """Wait ``SLEEP_S`` as if on I/O: int64 (1,)."""
    time.sleep(SLEEP_S)
    return np.array([len(path)], dtype=np.int64)


def tf_resize(path: Any, label: Any) -> Any:
    """``pil_resize`` in TensorFlow ops, for tfshards' ``graph`` mode (no Python per item)."""
    import tensorflow as tf

    image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
    return tf.cast(tf.image.resize(image, RESIZE, method="bilinear"), tf.uint8)
