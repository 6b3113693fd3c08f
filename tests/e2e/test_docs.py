"""Every code block of README.md and docs/*.md runs as written, or says why it cannot.

A ``python`` or ``bash`` block carries a marker on the line just above it:

    <!-- docs-test: run SETUP [torch] -->      run it, in a fresh folder made by SETUP
    <!-- docs-test: not run: REASON -->        never run (still compiled, or `bash -n` checked
                                               with placeholders such as <repo> as a word)

SETUP is ``empty`` (an empty folder), ``raw`` (``data/raw/<label>/*.jpg``: 50 JPEGs of
16 px in 4 labels), ``shards`` (``raw``, then ``data/listing``, a write to
``data/shards`` and its manifest copy ``data/manifest.json``, as after ``make demo``) or
``grown`` (``shards``, then one file added and the version grown from the first: its new
shard holds one record).
``torch`` runs the block with torch's two names the ``tfrecord`` package uses stubbed
unless torch is installed (~1 GB). ``text`` blocks are output and ``yaml`` blocks are
parsed; any other block, or a runnable block without a marker, fails the test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SETUPS = ("empty", "raw", "shards", "grown")
OPTIONS = ("torch",)
MARK = re.compile(r"<!-- docs-test: (.*?) -->")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page."""

    page: str
    line: int
    lang: str
    code: str
    mark: str | None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.mark is not None and self.mark.startswith("run ")

    @property
    def setup(self) -> str:
        return (self.mark or "").split()[1]

    @property
    def options(self) -> list[str]:
        return (self.mark or "").split()[2:]


def _blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    page = str(path.relative_to(ROOT))
    blocks, i = [], 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        start, lang = i, lines[i][3:].strip()
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        above = MARK.fullmatch(lines[start - 1].strip()) if start else None
        code = "\n".join(lines[start + 1 : end]) + "\n"
        blocks.append(Block(page, start + 1, lang, code, above.group(1) if above else None))
        i = end + 1
    return blocks


ALL = [b for page in PAGES for b in _blocks(page)]
RUN = [b for b in ALL if b.runs]


def _problem(block: Block) -> str | None:
    if block.lang in ("text", "yaml"):
        return "a text or yaml block is never run: drop its marker" if block.mark else None
    if block.lang not in ("python", "bash"):
        return f"language {block.lang!r}: use python, bash (run or marked), text or yaml"
    if block.mark is None:
        return "no <!-- docs-test: run SETUP --> or <!-- docs-test: not run: REASON --> above"
    if block.mark.startswith("not run:"):
        return None if block.mark.removeprefix("not run:").strip() else "not run, with no reason"
    if not block.runs or block.setup not in SETUPS:
        return f"marker {block.mark!r}: setup must be one of {SETUPS}"
    unknown = set(block.options) - set(OPTIONS)
    return f"unknown options {sorted(unknown)}" if unknown else None


def test_every_block_is_run_or_marked_not_run_with_a_reason() -> None:
    assert len(PAGES) > 5 and len(RUN) >= 8
    problems = [f"{b.id}: {p}" for b in ALL if (p := _problem(b))]
    assert problems == []
    marks = sum(len(MARK.findall(page.read_text())) for page in PAGES)
    assert marks == sum(b.mark is not None for b in ALL), "a marker not right above a block"


def test_blocks_not_run_still_parse() -> None:
    for block in ALL:
        if block.lang == "yaml":
            yaml.safe_load(block.code)
        elif block.lang == "python" and not block.runs:  # e.g. DALI installs only with CUDA
            compile(block.code, block.id, "exec")
        elif block.lang == "bash" and not block.runs:  # a placeholder <repo> reads as a word
            code = re.sub(r"<[^<>\n]+>", "PLACEHOLDER", block.code)
            subprocess.run(["bash", "-n", "-c", code], check=True)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_pages_reach_a_file_and_a_heading() -> None:
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if "://" in target:
                continue
            name, _, anchor = target.partition("#")
            linked = (page.parent / name).resolve() if name else page
            if not linked.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and linked.suffix == ".md":
                headings = re.findall(r"^#+ (.*)$", linked.read_text(), re.M)
                if anchor not in {_anchor(h) for h in headings}:
                    broken.append(f"{page.name}: {target}")
    assert broken == []


# Runs a python block in a process of its own (the tfrecord package and TensorFlow
# cannot share one) and writes its JSON-able globals to $DOCS_TEST_OUT. With
# ``torch`` and no torch installed, DataLoader workers 0..2 of 3 then read the dataset.
_HARNESS = """
import json, os, sys, types
data = None
if os.environ.get("DOCS_TEST_TORCH"):
    try:
        import torch
    except ImportError:
        data = types.ModuleType("torch.utils.data")
        data.IterableDataset = type("IterableDataset", (), {})
        data.get_worker_info = lambda: None
        torch = types.ModuleType("torch")
        torch.utils = types.ModuleType("torch.utils")
        torch.utils.data = data
        sys.modules.update({"torch": torch, "torch.utils": torch.utils, "torch.utils.data": data})
namespace = {"__name__": "__main__"}
exec(compile(sys.stdin.read(), os.environ["DOCS_TEST_ID"], "exec"), namespace)
kept = {}
for name, value in namespace.items():
    try:
        kept[name] = json.loads(json.dumps(value))
    except (TypeError, ValueError):
        pass
if data is not None:
    parts = []
    for k in range(3):
        data.get_worker_info = lambda k=k: types.SimpleNamespace(id=k, num_workers=3, seed=k)
        parts.append([bytes(r["image"]).hex() for r in namespace["dataset"]])
    kept["worker_parts"] = parts
json.dump(kept, open(os.environ["DOCS_TEST_OUT"], "w"))
"""

# `tfshards` on PATH, running this checkout's src/ (PYTHONPATH) with this interpreter.
_TFSHARDS = """#!{python}
from tfshards.cli import main

main()
"""


def _setup(folder: Path, setup: str) -> None:
    from tfshards import WriteConfig, list_files, write, write_listing, write_synthetic

    if setup == "empty":
        return
    here = os.getcwd()
    os.chdir(folder)  # relative paths, as in a project folder after `make demo`
    try:
        write_synthetic("data/raw", 50, 16, fmt="jpeg", classes=4, seed=1, workers=1)
        config = WriteConfig(
            out="data/shards", name="digits", num_shards=4, manifest_copy="data/manifest.json"
        )
        if setup in ("shards", "grown"):
            listing = list_files("data/raw")
            write_listing(listing, "data/listing")
            write(config, listing, progress=False)
        if setup == "grown":
            first = sorted(Path("data/raw").rglob("*.jpg"))[0]
            (first.parent / "added.jpg").write_bytes(first.read_bytes())
            listing = list_files("data/raw")
            write_listing(listing, "data/listing")
            write(config, listing, progress=False)
    finally:
        os.chdir(here)


def _env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    shim = bin_dir / "tfshards"
    shim.write_text(_TFSHARDS.format(python=sys.executable))
    shim.chmod(0o755)
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]])
    pythonpath = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PATH": path, "PYTHONPATH": pythonpath,
            "TFSHARDS_CACHE": str(tmp_path / "cache")}  # fmt: skip


def run_block(block: Block, tmp_path: Path) -> tuple[str, dict[str, object]]:
    """Run ``block`` in a fresh folder made by its setup: its stdout and, for python, globals."""
    folder = tmp_path / "project"
    folder.mkdir(parents=True)
    _setup(folder, block.setup)
    env = _env(tmp_path)
    out = tmp_path / "globals.json"
    if block.lang == "bash":
        command = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    else:
        command = [sys.executable, "-c", _HARNESS]
        env.update(DOCS_TEST_ID=block.id, DOCS_TEST_OUT=str(out))
        if "torch" in block.options:
            env["DOCS_TEST_TORCH"] = "1"
    done = subprocess.run(
        command, input=block.code if block.lang == "python" else None, cwd=folder, env=env,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, f"{block.id} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout, json.loads(out.read_text()) if out.exists() else {}


def _tf_data(printed: str, names: dict[str, object], folder: Path) -> None:
    assert printed.splitlines() == ["50 records"]


def _tfds(printed: str, names: dict[str, object], folder: Path) -> None:
    assert names["names"] == ["00", "01", "02", "03"]  # the manifest's labels
    shape, label = printed.strip().split(") ")
    assert shape == "(16, 16, 3" and label in names["names"]


def _torch(printed: str, names: dict[str, object], folder: Path) -> None:
    shards = json.loads((folder / "data/manifest.json").read_text())["shards"]
    assert min(s["records"] for s in shards) == 1  # the grown set's one-record shard
    assert printed.splitlines() == ["51 records"]
    files = sorted(p.read_bytes().hex() for p in (folder / "data/raw").rglob("*.jpg"))
    parts = names.get("worker_parts")
    if isinstance(parts, list):  # stubbed torch: each worker reads shards of its own
        assert all(0 < len(part) < 51 for part in parts)
        assert sorted(r for part in parts for r in part) == files


# What a block must print or define, beyond running: found by a string in its code.
CHECKS = {
    "tf.data.TFRecordDataset": _tf_data,
    "tensorflow_datasets": _tfds,
    "tfrecord_loader": _torch,
}


def test_the_checked_blocks_are_there() -> None:
    for needle in CHECKS:
        assert len([b for b in RUN if needle in b.code]) == 1, needle


@pytest.mark.slow
@pytest.mark.parametrize("block", RUN, ids=[b.id for b in RUN])
def test_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    printed, names = run_block(block, tmp_path)
    for needle, check in CHECKS.items():
        if needle in block.code:
            check(printed, names, tmp_path / "project")
