"""Listing a tree holds no row per file: peak memory at 200,000 files is that at 20,000."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Fresh process: its peak RSS is the interpreter, the imports and what the listing holds.
CHILD = """
import sys
from tfshards.listing.treelisting import list_to
summary = list_to(sys.argv[1], sys.argv[2], hash_cache=sys.argv[3])
print(summary.files)
"""


def _stub_tree(root: Path, files: int, per_dir: int = 1000) -> None:
    """``files`` hard links to one 16-byte stub per folder, 10 labels (seconds for 200,000)."""
    for start in range(0, files, per_dir):
        folder = root / f"label_{start // per_dir % 10}" / f"dir_{start // per_dir:04d}"
        folder.mkdir(parents=True)
        stub = folder / ".stub"
        stub.write_bytes(b"\xff\xd8\xff" + bytes(13))
        for i in range(start, min(files, start + per_dir)):
            os.link(stub, folder / f"{i:07d}.jpg")


def _peak_rss_kb(tmp_path: Path, files: int) -> int:
    """Peak RSS (KiB) of a fresh process listing ``files`` stub files, hashing them all."""
    root = tmp_path / f"raw{files}"
    _stub_tree(root, files)
    cache = tmp_path / f"hashes{files}.sqlite"
    args = [sys.executable, "-c", CHILD, str(root), str(tmp_path / f"out{files}"), str(cache)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(args, env=env, stdout=subprocess.PIPE)
    assert child.stdout is not None
    printed = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    assert child.returncode == 0
    assert int(printed) == files
    return int(usage.ru_maxrss)  # Linux: KiB


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "wait4"), reason="needs os.wait4 (POSIX)")
def test_peak_memory_does_not_grow_with_the_number_of_files(tmp_path: Path) -> None:
    small = _peak_rss_kb(tmp_path, 20_000)
    large = _peak_rss_kb(tmp_path, 200_000)
    assert large <= 1.2 * small, f"peak RSS {large} KiB at 200,000 files, {small} KiB at 20,000"
