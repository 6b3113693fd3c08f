"""A debugging trace of the records each training step read, named by the environment.

``TFSHARDS_TRAIN_TRACE=/tmp/trace-{worker}.jsonl`` makes ``tfshards train`` append
one JSON line per training step, ``[step, [id, ...]]``, to that file (``{worker}``:
this worker's index), each id the first 12 hex digits of the SHA-256 of a
record's image bytes and label byte: which records a worker read, in which step.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from typing import Any

ENV = "TFSHARDS_TRAIN_TRACE"
OnBatch = Callable[[int, Any], None]


def record_ids(images: Any, labels: Any) -> list[str]:
    """Each record of a batch (NumPy arrays) named by its pixels and label."""
    return [
        hashlib.sha256(x.tobytes() + bytes([int(y)])).hexdigest()[:12]
        for x, y in zip(images, labels, strict=True)
    ]


def from_env(worker: int, local: Callable[[Any], tuple[Any, ...]]) -> OnBatch | None:
    """The trace :envvar:`TFSHARDS_TRAIN_TRACE` asks for, or None.

    ``local``: this worker's tensors of a (possibly per-replica) batch value.
    """
    template = os.environ.get(ENV)
    if not template:
        return None
    path = template.format(worker=worker)

    def on_batch(step: int, batch: Any) -> None:
        ids: list[str] = []
        for images, labels in zip(local(batch[0]), local(batch[1]), strict=True):
            ids.extend(record_ids(images.numpy(), labels.numpy()))
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps([step, ids]) + "\n")

    return on_batch
