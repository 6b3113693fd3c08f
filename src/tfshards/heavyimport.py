"""Importing TensorFlow (and Keras) without the cyclic garbage collector walking them.

``import tensorflow, keras`` creates about a million objects that live as long as the
process. The collector walks them on every full collection: during the import
itself (0.3-0.5 s of its 2.5-2.9 s of CPU, `/usr/bin/time python -c "import
tensorflow, keras"` with the collector on and off, three runs each) and on each
full collection of the training that follows (~0.15 s each). A 3-epoch
``tfshards train`` of 48 images spent 1.1 s of its 5.4 s of CPU in the collector.

:func:`load` pauses the collector for the import. In a tfshards command's own
process (:func:`own_process`, called by the CLI), it then moves every object alive
into the permanent generation, which later collections skip: garbage cycles alive
at that moment are never freed, and a command holds few then. A library caller's
process is left unfrozen: its own objects stay collectable.
"""

from __future__ import annotations

import gc
import importlib
import sys

_OWN = [False]  # whether this process is a tfshards command's, set by own_process()


def own_process() -> None:
    """Say that this process runs a tfshards command (nothing else's objects live in it)."""
    _OWN[0] = True


def load(*modules: str) -> None:
    """Import ``modules`` (TensorFlow's, in order) with the collector paused, then, in a
    command's own process, freeze what is alive; nothing to do when every one is
    imported already."""
    if all(name in sys.modules for name in modules):
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        for name in modules:
            importlib.import_module(name)
    finally:
        if _OWN[0]:
            gc.freeze()
        if enabled:
            gc.enable()
