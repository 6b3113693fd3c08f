"""Shared fixtures: a clean memory:// store per test, quiet TensorFlow and DVC, and the
scenarios most tests draw: a synthetic raw image tree, listed and written as a shard set."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # imported in the fixtures: conftest stays light for tests that never write
    from tfshards.listing.listing import Listing
    from tfshards.shardset.manifest import Manifest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("DVC_NO_ANALYTICS", "true")
# Where PYTHONDONTWRITEBYTECODE is set (CI machines set it), every process the tests start
# (CLI commands, DVC stages, pool workers) compiled this checkout's modules again:
# `import tfshards.writing.writer` took 0.52 s of CPU instead of 0.42 s. An installed
# user reads compiled files; so do the tests, from the first process that writes them.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


_FROZEN_AT = [0]  # how many modules were imported when the worker last froze its objects


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After a test that imported much (TensorFlow, Keras, DVC: a million objects that live
    as long as the worker), freeze what is alive, so the collector's full passes skip
    it: in the reading and validation tests, full passes took 2.5 of a worker's 39 s of
    CPU, each walking TensorFlow's objects again (as tfshards.heavyimport says)."""
    if len(sys.modules) > _FROZEN_AT[0] + 100:
        gc.freeze()
        _FROZEN_AT[0] = len(sys.modules)


@pytest.fixture(autouse=True, scope="session")
def caches_in_tmp(tmp_path_factory: pytest.TempPathFactory) -> None:
    """`tfshards list` remembers file hashes per user, validate image hashes, the loader
    shard copies: keep the tests' own apart."""
    path = tmp_path_factory.mktemp("hash-cache") / "listing-hashes.sqlite"
    os.environ["TFSHARDS_HASH_CACHE"] = str(path)
    os.environ.setdefault("TFSHARDS_CACHE", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(autouse=True)
def clean_memory_fs() -> Iterator[None]:
    """memory:// is a process-wide store; give each test an empty one."""
    from fsspec.implementations.memory import MemoryFileSystem

    MemoryFileSystem.store.clear()
    MemoryFileSystem.pseudo_dirs.clear()
    MemoryFileSystem.pseudo_dirs.append("")
    yield
    MemoryFileSystem.store.clear()
    MemoryFileSystem.pseudo_dirs.clear()
    MemoryFileSystem.pseudo_dirs.append("")


RawMaker = Callable[..., Path]
SetWriter = Callable[..., "Manifest"]


def _synthetic(root: Path, count: int, size: int, fmt: str, classes: int, seed: int) -> Path:
    from tfshards.project.sample import write_synthetic

    write_synthetic(str(root), count, size, fmt=fmt, classes=classes, seed=seed, workers=1)
    return root


@pytest.fixture
def make_raw(tmp_path: Path, shared_raw: RawMaker) -> RawMaker:
    """``make_raw(count, size, fmt=, classes=, seed=, path=)``: a fresh synthetic tree.

    A copy, at ``path`` (default ``tmp_path / "raw"``), of the tree
    ``tfshards.project.sample.write_synthetic`` writes for that recipe (made once per
    session): the files are the test's own, with new mtimes, to change as it likes.
    Copying 2,000 8 px PNGs takes ~0.1 s; writing them, ~2.5 s.
    """

    def make(
        count: int,
        size: int,
        *,
        fmt: str = "jpeg",
        classes: int = 10,
        seed: int = 0,
        path: Path | None = None,
    ) -> Path:
        target = path or tmp_path / "raw"
        tree = shared_raw(count, size, fmt=fmt, classes=classes, seed=seed)
        shutil.copytree(tree, target, copy_function=shutil.copyfile, dirs_exist_ok=True)
        return target

    return make


@pytest.fixture(scope="session")
def shared_raw(tmp_path_factory: pytest.TempPathFactory) -> RawMaker:
    """``shared_raw(count, size, fmt=, classes=, seed=)``: one tree per recipe per session.

    For tests that only read the tree: every caller with that recipe gets the same folder.
    """
    trees: dict[tuple[int, int, str, int, int], Path] = {}

    def make(count: int, size: int, *, fmt: str = "jpeg", classes: int = 10, seed: int = 0) -> Path:
        recipe = (count, size, fmt, classes, seed)
        if recipe not in trees:
            trees[recipe] = _synthetic(tmp_path_factory.mktemp("raw"), *recipe)
        return trees[recipe]

    return make


@pytest.fixture
def write_options() -> Mapping[str, Any]:
    """WriteConfig keywords that ``write_set`` uses unless a call names them; a test module
    overrides this fixture to give its own defaults."""
    return {}


@pytest.fixture
def write_set(write_options: Mapping[str, Any]) -> SetWriter:
    """``write_set(raw, out, **WriteConfig keywords)``: list ``raw`` (a folder, or a Listing
    as it is) and write a shard set at ``out`` without progress; returns its Manifest."""

    from tfshards.listing.listing import Listing, list_files
    from tfshards.writing.config import WriteConfig
    from tfshards.writing.writer import write

    def make(raw: Path | str | Listing, out: Path | str, **kw: Any) -> Manifest:
        listing = raw if isinstance(raw, Listing) else list_files(str(raw))
        config = WriteConfig(out=str(out), **{**write_options, **kw})
        return write(config, listing, progress=False).manifest

    return make


@pytest.fixture(params=["c", "python"])
def loop(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test on the compiled loops (tfshards.format._native) and on the pure-Python ones."""
    from tfshards.format import native

    if request.param == "c" and native.NATIVE is None:
        pytest.skip("tfshards.format._native is not built")
    if request.param == "python":
        monkeypatch.setattr(native, "NATIVE", None)
    return str(request.param)


def _mount(target: Path, *args: str) -> None:
    target.mkdir(exist_ok=True)
    done = subprocess.run(["mount", *args, str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here ({done.stderr.strip()}): needs root")


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: a real ENOSPC once a few files are written."""
    disk = tmp_path / "tiny"
    _mount(disk, "-t", "tmpfs", "-o", "size=64k", "tmpfs")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A read-only bind mount of an empty folder: a real EROFS."""
    folder = tmp_path / "ro"
    _mount(folder, "--bind", "-o", "ro", str(tmp_path / "ro"))
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


@pytest.fixture(scope="session")
def _moto_server() -> Iterator[str]:
    """One moto S3 server on 127.0.0.1 per test process (its state is process-wide anyway)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def endpoint(_moto_server: str) -> str:
    """The URL of a real S3 endpoint (moto's server) with no bucket: every test starts empty."""
    import urllib.request

    request = urllib.request.Request(f"{_moto_server}/moto-api/reset", method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
    return _moto_server


@pytest.fixture
def s3(endpoint: str) -> Iterator[dict[str, Any]]:
    """fsspec storage options for a fresh bucket ``bucket`` on moto's server; removed after."""
    import s3fs

    options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
    fs.mkdir("bucket")
    yield options
    fs.rm("bucket", recursive=True)
    s3fs.S3FileSystem.clear_instance_cache()
