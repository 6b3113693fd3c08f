"""Where tfshards keeps what it can always make again: shard copies, listing and image hashes.

``$TFSHARDS_CACHE``, else ``$XDG_CACHE_HOME/tfshards``, else ``~/.cache/tfshards``.
Deleting the folder loses only time.
"""

from __future__ import annotations

import os

ENV = "TFSHARDS_CACHE"


def root() -> str:
    """The cache folder (it may not exist yet)."""
    if os.environ.get(ENV):
        return os.path.expanduser(os.environ[ENV])  # "~/x" from a file no shell expanded
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tfshards")
