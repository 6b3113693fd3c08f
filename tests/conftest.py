"""Shared fixtures: a clean memory:// store per test, quiet TensorFlow and DVC."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("DVC_NO_ANALYTICS", "true")


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
    """Run a test on the compiled loops (tfshards._native) and on the pure-Python ones."""
    from tfshards import native

    if request.param == "c" and native.NATIVE is None:
        pytest.skip("tfshards._native is not built")
    if request.param == "python":
        monkeypatch.setattr(native, "NATIVE", None)
    return str(request.param)
