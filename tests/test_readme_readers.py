"""The README's "Reading the shards elsewhere" blocks run as written on a fresh write."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tfshards.listing.listing import list_files
from tfshards.project.sample import write_synthetic
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Reading the shards elsewhere\n"


def _blocks() -> list[str]:
    text = README.read_text()
    assert SECTION in text
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


# The PyTorch block runs in a process of its own (the tfrecord package and TensorFlow
# cannot share one), with torch's two names the tfrecord package uses stubbed unless
# torch is installed (~1 GB). Then DataLoader workers 0..2 of 3 read the same dataset.
_TORCH = """
import json, sys, types
try:
    import torch
    data = None
except ImportError:
    data = types.ModuleType("torch.utils.data")
    data.IterableDataset = type("IterableDataset", (), {})
    data.get_worker_info = lambda: None
    torch = types.ModuleType("torch")
    torch.utils = types.ModuleType("torch.utils")
    torch.utils.data = data
    sys.modules.update({"torch": torch, "torch.utils": torch.utils, "torch.utils.data": data})
namespace = {}
exec(compile(sys.stdin.read(), "README.md", "exec"), namespace)
parts = []
if data is not None:
    for k in range(3):
        data.get_worker_info = lambda k=k: types.SimpleNamespace(id=k, num_workers=3, seed=k)
        parts.append([bytes(r["image"]).hex() for r in namespace["dataset"]])
print(json.dumps(parts))
"""


@pytest.mark.slow
def test_each_reader_block_reads_every_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_synthetic(str(tmp_path / "raw"), 50, 16, fmt="jpeg", classes=4, seed=1, workers=1)
    monkeypatch.chdir(tmp_path)
    config = WriteConfig(
        out="data/shards", name="digits", num_shards=4, manifest_copy="data/manifest.json"
    )
    manifest = write(config, list_files("raw"), progress=False).manifest
    tf_data, tfds, torch, dali = _blocks()
    assert "nvidia.dali" in dali and "MultiTFRecordDataset" in torch
    compile(dali, "README.md", "exec")  # DALI itself installs only with CUDA
    namespace: dict[str, Any] = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(tf_data, "README.md", "exec"), {})
        exec(compile(tfds, "README.md", "exec"), namespace)
    assert namespace["names"] == list(manifest.labels) == ["00", "01", "02", "03"]
    label = namespace["names"][namespace["example"]["label"]]
    assert out.getvalue().splitlines() == ["50 records", f"(16, 16, 3) {label}"]
    done = subprocess.run(
        [sys.executable, "-c", _TORCH], input=torch, capture_output=True, text=True, check=True
    )
    printed, parts = done.stdout.splitlines()
    assert printed == "50 records"
    files = sorted(p.read_bytes().hex() for p in (tmp_path / "raw").rglob("*.jpg"))
    if json.loads(parts):  # stubbed torch: each worker reads its part of each shard, via the index
        assert all(0 < len(part) < 50 for part in json.loads(parts))
        assert sorted(r for part in json.loads(parts) for r in part) == files
