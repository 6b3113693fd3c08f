"""TensorFlow's ``decode_image``, the decoder training uses, as validate's decode rule
asks it: does it refuse these bytes, and in which words."""

from __future__ import annotations

import functools
import os
import re
import sys
from typing import Any

from tfshards import heavyimport

_OP_NOISE = re.compile(r"^\{\{function_node [^}]*\}\}\s*|\s*\[Op:\w+\].*$", re.DOTALL)


@functools.cache
def _decode_image() -> Any:
    """``tf.io.decode_image`` as one traced function (a third of an eager call's cost).

    Imported here first (validate's workers), TensorFlow is told to leave its oneDNN
    kernels off: decoding runs none, and with them on its import prints two log lines
    (``oneDNN custom operations are on``, and absl's about logging before its set-up)
    that ``TF_CPP_MIN_LOG_LEVEL`` does not hold back, before each worker's findings.
    """
    if "tensorflow" not in sys.modules:
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    heavyimport.load("tensorflow")  # only with --decode, or where training already imported it
    import tensorflow as tf

    spec = tf.TensorSpec([], tf.string)
    return tf.function(lambda data: tf.io.decode_image(data, expand_animations=False), [spec])


def refuses(payload: bytes) -> str | None:
    """TensorFlow's words (one line) when ``decode_image`` refuses ``payload``; else None."""
    decode = _decode_image()  # first: it imports TensorFlow
    import tensorflow as tf

    try:
        decode(tf.constant(bytes(payload)))
    except tf.errors.OpError as exc:  # InvalidArgumentError: bytes it cannot decode
        said = _OP_NOISE.sub("", exc.message).strip().splitlines()
        return said[0] if said else type(exc).__name__
    return None
