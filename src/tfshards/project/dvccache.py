"""Whether the DVC cache of the project around a folder holds a file's bytes.

``write.old_versions: remove`` deletes the other versions of a local shard
folder on the ground that DVC's cache holds every version ``dvc repro``
wrote: DVC saves each file of a stage's outs in its cache after the stage
runs. A version written by hand into that folder (``tfshards write ... --out
data/shards`` outside a stage) is in no cache, so it exists nowhere else.
A version's ``manifest.json`` stands for it: DVC caches a folder out's files
together, and that one is small to hash (the shards would cost a read of the
whole set).
"""

from __future__ import annotations

import hashlib
import os


def project_of(folder: str) -> str | None:
    """The nearest folder at or above ``folder`` holding a ``.dvc`` folder; None when none."""
    here = os.path.realpath(folder)
    while True:
        if os.path.isdir(os.path.join(here, ".dvc")):
            return here
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def holds(project: str, path: str) -> bool:
    """Whether the DVC cache of ``project`` holds the bytes of the local file ``path``
    (by their md5, as DVC 3 names cached files); False when it cannot be read."""
    from dvc.repo import Repo  # ~1 s of imports: only where a version would be deleted

    try:
        with open(path, "rb") as f:
            md5 = hashlib.md5(f.read(), usedforsecurity=False).hexdigest()
    except OSError:
        return False
    with Repo(project) as repo:
        return os.path.isfile(repo.cache.local.oid_to_path(md5))
