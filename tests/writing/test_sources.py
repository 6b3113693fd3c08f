"""Each record source frames the same records, and names a changed file the same way."""

from __future__ import annotations

import hashlib
from pathlib import Path

import fsspec
import pytest

from tfshards.format.recordbuffer import RecordBuffer
from tfshards.listing.entry import Entry
from tfshards.writing.features import FeatureFiles, base_specs
from tfshards.writing.sources import FetchedFiles, LocalFiles, RecordSource


def _files(root: Path) -> list[Entry]:
    entries = []
    for i, data in enumerate([b"first", b"second file", b"x" * 3000]):
        rel = f"d{i % 2}/{i}.bin"
        (root / rel).parent.mkdir(exist_ok=True)
        (root / rel).write_bytes(data)
        entries.append(Entry(rel, len(data), i, "sha256:" + hashlib.sha256(data).hexdigest()))
    return entries


def _framed(source: RecordSource, entries: list[Entry]) -> tuple[bytes, list[tuple[str, str]]]:
    out = bytearray()
    buffer = RecordBuffer(lambda view: out.extend(view), "image")
    problems = [(e.path, str(p)) for e, p in source.frame(buffer, entries)]
    buffer.flush()
    return bytes(out), problems


def _sources(root: Path) -> dict[str, RecordSource]:
    fs = fsspec.filesystem("file")
    return {
        "local": LocalFiles(f"{root}/"),
        "fetched": FetchedFiles(fs, f"{root}/"),
        "features": FeatureFiles(fs, str(root), "image", None, None, None, base_specs("image")),
    }


def test_every_source_frames_the_same_records(tmp_path: Path, loop: str) -> None:
    entries = _files(tmp_path)
    framed = {name: _framed(source, entries) for name, source in _sources(tmp_path).items()}
    assert framed["local"][1] == [] and framed["local"][0]
    assert framed["fetched"] == framed["local"]
    assert framed["features"] == framed["local"]


@pytest.mark.parametrize("name", ["local", "fetched", "features"])
def test_a_file_that_changed_size_is_a_problem_and_the_rest_is_framed(
    tmp_path: Path, name: str
) -> None:
    entries = _files(tmp_path)
    (tmp_path / entries[1].path).write_bytes(b"short")
    data, problems = _framed(_sources(tmp_path)[name], entries)
    assert problems == [
        (entries[1].path, "file changed since it was listed: expected 11 bytes, found 5")
    ]
    kept, _ = _framed(_sources(tmp_path)["local"], [entries[0], entries[2]])
    assert data == kept
