"""Put the previous version's kept shards into the new version directory without reading them.

Local disk: a hard link (the same inode, no byte read or written), so both
versions hold the file and removing the old version leaves the new one whole;
across filesystems, a copy. An object store: a server-side copy (``fs.copy``:
S3 CopyObject, GCS rewrite), no byte through this machine. Each shard's
companions (record index, member list) travel with it; the new name is the
new version's ``NNNNN-of-NNNNN``.
"""

from __future__ import annotations

import dataclasses
import errno
import os
from collections.abc import Callable, Collection
from typing import Any

from tfshards import atomicfile, storage
from tfshards.errors import ShardError
from tfshards.shardset import layout
from tfshards.writing import imagestats
from tfshards.writing.plan import KeptFile, Plan
from tfshards.writing.shard import ShardResult

# Link failures that mean "not here": another filesystem, or one without hard links.
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP}


def keep(
    fs_out: Any,
    version_path: str,
    planned: Plan,
    carried: Collection[int] = (),
    **options: Any,
) -> list[ShardResult]:
    """Place every kept shard of ``planned`` (and its companions) in ``version_path``.

    ``carried``: the buckets whose statistics carry over whole
    (:func:`imagestats.carried`); their shards' results hold no statistics.

    Raises:
        ShardError: a previous shard is missing or not the size its manifest says.
    """
    base = planned.base
    if base is None or not planned.kept:
        return []
    fs_in, base_path = storage.open_url(base.directory, **options)
    place = _placer(fs_in, fs_out)
    results = []
    for kept in planned.kept:
        for src, dst in _files(base_path, version_path, kept):
            place(src, dst)
        _check_size(fs_out, storage.join(version_path, kept.name), kept)
        info = dataclasses.replace(kept.info, name=kept.name)
        old, params = kept.info.name, planned.params
        images = imagestats.kept(
            fs_in, base_path, old, fs_out, version_path, kept.name, params, place,
            counted=kept.info.bucket in carried,
        )  # fmt: skip
        results.append(ShardResult(info, (), base.schema, True, images))
    return results


def _placer(fs_in: Any, fs_out: Any) -> Callable[[str, str], None]:
    """How a file of the previous version is placed in the new one: link, server copy, copy."""
    if storage.is_local(fs_in) and storage.is_local(fs_out):
        return _link

    def copy(src: str, dst: str) -> None:
        if storage.protocol(fs_in) == storage.protocol(fs_out):
            fs_out.makedirs(os.path.dirname(dst), exist_ok=True)
            fs_out.copy(src, dst)
        else:
            atomicfile.write_atomic(fs_out, dst, [storage.read_bytes(fs_in, src)])

    return copy


def _files(base: str, version: str, kept: KeptFile) -> list[tuple[str, str]]:
    """The shard and its companions: (path in the previous version, path in this one)."""
    old, new = kept.info.name, kept.name
    pairs = [(storage.join(base, old), storage.join(version, new))]
    if kept.info.index_sha256 is not None:
        pairs.append((layout.index_path(base, old), layout.index_path(version, new)))
    pairs.append((layout.records_path(base, old), layout.records_path(version, new)))
    return pairs


def _link(src: str, dst: str) -> None:
    """Hard-link ``src`` as ``dst`` (kept when already that file); a copy across filesystems."""
    atomicfile.make_dirs(os.path.dirname(dst) or ".")
    try:
        if os.path.lexists(dst):  # a killed run's link: the same file, or replaced below
            if os.path.samefile(src, dst):
                return
            os.unlink(dst)
        os.link(src, dst)  # a link appears whole or not at all
    except FileNotFoundError:
        # a kept shard's record index and member list live in the layout's folders
        what = "file" if os.path.basename(os.path.dirname(src)) in layout.FOLDERS else "shard"
        raise ShardError(
            f"{src}: expected this {what} of the previous version, found nothing there; "
            "write again with --previous none to write every shard",
            shard=os.path.basename(src),
        ) from None
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
        with open(src, "rb") as f:
            atomicfile.write_atomic(storage.open_url(dst)[0], dst, [f.read()])


def _check_size(fs: Any, path: str, kept: KeptFile) -> None:
    size = fs.size(path)
    if size != kept.info.bytes:
        raise ShardError(
            f"{path}: expected the kept shard {kept.info.name} of {kept.info.bytes} bytes, "
            f"found {size} bytes; the previous version is damaged: validate it, or write "
            "again with --previous none",
            shard=kept.name,
        )
