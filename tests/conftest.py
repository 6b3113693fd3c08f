"""Shared fixtures: a clean memory:// store per test, quiet TensorFlow and DVC."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("DVC_NO_ANALYTICS", "true")


@pytest.fixture(autouse=True, scope="session")
def hash_cache_in_tmp(tmp_path_factory: pytest.TempPathFactory) -> None:
    """`tfshards list` remembers file hashes per user: keep the tests' own apart."""
    path = tmp_path_factory.mktemp("hash-cache") / "listing-hashes.sqlite"
    os.environ["TFSHARDS_HASH_CACHE"] = str(path)


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
