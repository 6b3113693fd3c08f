"""Pinned bytes: the sample and a synthetic set always write these exact shards and manifests.

A refactor must change no byte. When a change is *meant* to change bytes (a new
format version, a new version-naming rule), update the pins below in the same
commit and say why in its message.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tfshards.listing.listing import list_files, write_listing
from tfshards.project.sample import write_digits, write_synthetic
from tfshards.run import executor
from tfshards.run.executor import Executor
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

# Any fixed mtime: a version name must not depend on it, but pinning it keeps
# this test about bytes, not about how the name is derived.
_MTIME = 1_700_000_000

# name -> (shards digest, manifest sha256). The shards digest is the sha256 of
# "<shard name> <shard sha256>\n" lines in manifest order. The manifest holds the
# sha256 of each record index file and of the tfds metadata (uncompressed sets
# only), so its pin covers their bytes too.
PINNED = {
    "digits": (
        "61fbad36a11dad9a8cd4321bcf0434c830e159482fe2f6d6e12140be13911465",
        "94d99d279009b7c10f4e9a1188b7943313c4e5683a48419035d915a0c2998796",
    ),
    "synth-jpeg-none": (
        "cd0cefc564549d08d220679a14f046b7115dab72d2d2496a36c8195d3267fff3",
        "39070d6b39b450b8155a1f88f2b1bf538a9ba93a3e3810b93919a059ab3103d4",
    ),
    # synth-jpeg-none grown: 10 files added, 2 removed, written from the first version.
    "synth-jpeg-none+grown": (
        "18bf8bbb353153fec3bbeeacce2ca2bf3e7d481f46bcd9cb09f6442eaa85a728",
        "2225cc7042e6512063756332acff3c397f4a037044f425b49d6d7360ca51cb5c",
    ),
    "synth-jpeg-zlib": (
        "1a69c2a54287cfa2eee0864cb11bb07ddf4d96dcd4d2dc37e55a283b3418f4a0",
        "2094e0facdbdfea69437c2495c81cf23691f7f787eb1653b37bbe40d0fc536a8",
    ),
    "synth-png-gzip": (
        "ca745647a2f58bca42f5d6f320375b96d6d936bc1ac61fac1fe5e5ad6a2e125b",
        "71b48d0af08c8a9f439b91dbde7ddebfcaa928a1bd7641f510b1d8f398ecdbfc",
    ),
}


def _fix_mtimes(root: Path) -> None:
    for path in root.rglob("*"):
        os.utime(path, (_MTIME, _MTIME))


def _digests(out: Path, manifest_root: str) -> tuple[str, str]:
    version = out / manifest_root.rsplit("/", 1)[-1]
    manifest_bytes = (version / "manifest.json").read_bytes()
    shards = {
        s["name"]: hashlib.sha256((version / s["name"]).read_bytes()).hexdigest()
        for s in json.loads(manifest_bytes)["shards"]
    }
    lines = "".join(f"{name} {sha}\n" for name, sha in shards.items())
    return hashlib.sha256(lines.encode()).hexdigest(), hashlib.sha256(manifest_bytes).hexdigest()


def _write_case(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    executor: str = "auto",
    *,
    stored: bool = False,
    workers: int = 1,
) -> tuple[str, str]:
    """Write ``case``; ``stored`` goes through a listing directory (read in bounded memory)."""
    monkeypatch.chdir(tmp_path)
    raw = Path("raw")
    if case == "digits":
        write_digits(str(raw))
        _fix_mtimes(raw)
        listing = list_files("raw", extensions=[".png"])
        config = WriteConfig(
            out="shards",
            name="digits",
            num_shards=16,
            seed=42,
            executor=executor,
            workers=workers,
        )
    else:
        fmt, compression = case.split("+")[0].split("-")[1:]
        write_synthetic(str(raw), 103, 24, fmt=fmt, classes=5, seed=3, workers=1)
        _fix_mtimes(raw)
        listing = list_files("raw")
        config = WriteConfig(
            out="shards",
            name="synth",
            num_shards=5,
            seed=7,
            compression=compression,
            executor=executor,
            workers=workers,
        )
    if case.endswith("+grown"):
        config = dataclasses.replace(config, manifest_copy="manifest.json")
        write(config, listing, progress=False)
        _grow(raw)
        listing = list_files("raw")
    if stored:
        write_listing(listing, "listing")
    result = write(config, "listing" if stored else listing, progress=False)
    return _digests(Path("shards"), result.manifest.root)


def _grow(raw: Path) -> None:
    """Copy 10 files under new names, remove 2: the same change on every run."""
    files = sorted(raw.rglob("*.*"))
    for path in files[::10][:10]:
        (path.parent / f"added_{path.name}").write_bytes(path.read_bytes())
    for path in files[5:7]:
        path.unlink()
    _fix_mtimes(raw)


@pytest.mark.parametrize("case", sorted(PINNED))
def test_written_bytes_match_the_pins(case, loop, tmp_path, monkeypatch):
    """Both the compiled and the pure-Python loops write the pinned bytes."""
    assert _write_case(tmp_path, monkeypatch, case) == PINNED[case]


class _LastFirst(Executor):
    """A test-only executor: every task in this process, the last one first."""

    name = "last-first"
    in_process = True

    def map(
        self,
        fn: Callable[[Any], Any],
        tasks: Sequence[Any],
        *,
        describe: Callable[[Any], str] = str,
        needs: Any = None,
        note: Callable[[str], object] | None = None,
    ) -> Iterator[tuple[int, Any]]:
        for i in reversed(range(len(tasks))):
            yield i, fn(tasks[i])


def test_a_new_executor_is_one_class_and_writes_the_pinned_bytes(tmp_path, monkeypatch):
    executor.names()  # the built-ins register now, into the real registry, not the copy
    monkeypatch.setattr(executor, "_REGISTRY", {**executor._REGISTRY})  # this test's only
    executor.register(_LastFirst)
    assert "last-first" in executor.names()
    assert (
        _write_case(tmp_path, monkeypatch, "synth-png-gzip", "last-first")
        == PINNED["synth-png-gzip"]
    )


@pytest.mark.parametrize("workers", [1, 2, 8])
@pytest.mark.parametrize("case", ["digits", "synth-png-gzip", "synth-jpeg-none+grown"])
def test_a_listing_directory_read_line_by_line_writes_the_pinned_bytes(
    case, workers, loop, tmp_path, monkeypatch
):
    """Tasks that read their own listing lines, on 1, 2 or 8 workers, change no byte."""
    got = _write_case(tmp_path, monkeypatch, case, stored=True, workers=workers)
    assert (tmp_path / "listing" / "files.idx").exists()
    assert got == PINNED[case]
