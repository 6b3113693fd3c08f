"""Pinned bytes: the sample and a synthetic set always write these exact shards and manifests.

A refactor must change no byte. When a change is *meant* to change bytes (a new
format version, a new version-naming rule), update the pins below in the same
commit and say why in its message.
"""

from __future__ import annotations

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
        "c54282dcc8e8b707245e09dd0b88ab4bcb21b43d82c07307601436c6ad06b272",
        "13a814882817fb08f9b643fbaefaee922a680c212217c8992ac4ece82fadf0af",
    ),
    "synth-jpeg-none": (
        "557aba005f80ad6080a0606144dd4aa3fd80358c3100b90c3ae5d46332382708",
        "2b654aa429d2d91dae416e92c8432e9a63d8eb14621abc1937e4fc86f9e7a2cc",
    ),
    "synth-png-gzip": (
        "0973701c65dc333d75133542e85389f595f4c08d2dcf750b793cde94d75126f8",
        "68061e088fd875f909d58d30c83ca343befab5d514b871b5e0064886b7b45ff7",
    ),
    "synth-jpeg-zlib": (
        "3ad086d615d066805e2bf329a66f48c25fbc2be2203c7af6b767f1561e5ca4ad",
        "d881ceb8325acd6c3114894fd7cd631c0d4cbb371d49921610f506c634ad3036",
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
        fmt, compression = case.split("-")[1:]
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
    if stored:
        write_listing(listing, "listing")
    result = write(config, "listing" if stored else listing, progress=False)
    return _digests(Path("shards"), result.manifest.root)


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
@pytest.mark.parametrize("case", ["digits", "synth-png-gzip"])
def test_a_listing_directory_read_line_by_line_writes_the_pinned_bytes(
    case, workers, loop, tmp_path, monkeypatch
):
    """Tasks that read their own listing lines, on 1, 2 or 8 workers, change no byte."""
    got = _write_case(tmp_path, monkeypatch, case, stored=True, workers=workers)
    assert (tmp_path / "listing" / "files.idx").exists()
    assert got == PINNED[case]
