"""A stored listing read in bounded memory: checks, reads by line, and write's flat peak RSS."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from array import array
from pathlib import Path

import pytest

from handedits import edit_listing_line
from linktree import link_tree_listing
from tfshards.errors import InputError
from tfshards.listing import storedlisting
from tfshards.listing.listing import list_files, read_listing, write_listing
from tfshards.listing.storedlisting import OFFSETS_NAME, open_stored
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write


@pytest.fixture
def listed(tmp_path: Path) -> Path:
    for label in ("cat", "dog"):
        (tmp_path / "raw" / label).mkdir(parents=True)
        for i in range(7):
            data = b"\xff\xd8\xff\xda" + f"{label}{i}".encode() + b"\xff\xd9"  # JPEG markers
            (tmp_path / "raw" / label / f"{i:03d}é.jpg").write_bytes(data)
    write_listing(list_files(str(tmp_path / "raw")), str(tmp_path / "listing"))
    return tmp_path / "listing"


def test_rows_read_by_line_number_equal_the_listing_entries(listed: Path) -> None:
    listing = read_listing(str(listed))
    stored = open_stored(str(listed))
    assert stored is not None
    assert (stored.files, stored.total_bytes, stored.labels) == (
        14,
        listing.total_bytes,
        ("cat", "dog"),
    )
    order = array("I", [13, 0, 5, 5, 7, 1])
    rows = [row for batch in stored.rows(order).batches(size=4) for row in batch]
    assert rows == [tuple(listing.entries[j]) for j in order]


def test_paths_stream_in_line_order_across_read_chunks(
    listed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = open_stored(str(listed))
    assert stored is not None
    monkeypatch.setattr(storedlisting, "_CHUNK", 7)  # lines (and a 2-byte "é") cut anywhere
    assert list(stored.paths()) == [e.path for e in read_listing(str(listed)).entries]


def test_a_listing_without_offsets_is_still_written_from_its_entries(
    listed: Path, tmp_path: Path
) -> None:
    config = WriteConfig(out=str(tmp_path / "a"), num_shards=3)
    streamed = write(config, str(listed), progress=False).manifest
    (listed / OFFSETS_NAME).unlink()
    assert open_stored(str(listed)) is None
    config = WriteConfig(out=str(tmp_path / "b"), num_shards=3)
    whole = write(config, str(listed), progress=False).manifest
    assert whole.to_json() == streamed.to_json().replace(b"/a/", b"/b/")


def test_stale_offsets_are_reported_naming_the_index_file(listed: Path) -> None:
    data = (listed / OFFSETS_NAME).read_bytes()
    (listed / OFFSETS_NAME).write_bytes(data[:-8])
    with pytest.raises(InputError, match=r"files\.idx: expected 120 bytes ending with .*: stale"):
        open_stored(str(listed))
    shifted = array("Q")
    shifted.frombytes(data)
    shifted[3] += 1
    (listed / OFFSETS_NAME).write_bytes(shifted.tobytes())
    stored = open_stored(str(listed))
    assert stored is not None
    with pytest.raises(InputError, match=r"files\.idx: line 3: expected the offsets of a line"):
        list(stored.rows(array("I", [2])).batches())


def test_an_edited_files_jsonl_is_refused_before_any_shard(listed: Path, tmp_path: Path) -> None:
    path = listed / "files.jsonl"
    path.write_bytes(path.read_bytes().replace(b'"size":10', b'"size":11', 1))
    with pytest.raises(InputError, match=r"files\.jsonl: expected sha256 .*: edited or stale"):
        write(WriteConfig(out=str(tmp_path / "out")), str(listed), progress=False)
    assert not (tmp_path / "out").exists()


# Run in a fresh interpreter: ru_maxrss of a child of pytest can report pytest's own peak,
# so the child reads its own high-water mark (VmHWM) after the write.
_CHILD = textwrap.dedent(
    """
    import sys
    from tfshards.writing.config import WriteConfig
    from tfshards.writing.writer import write
    write(WriteConfig(out=sys.argv[2], workers=2), sys.argv[1], progress=False)
    with open("/proc/self/status") as f:
        print(next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")))
    """
)


def _tree_listing(tmp_path: Path, files: int) -> str:
    """``files`` hard links to 10 real 16-byte files, listed without hashing each link."""
    return link_tree_listing(tmp_path, files)


def _peak_kb(listing: str, out: str) -> int:
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, listing, out],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return int(child.stdout.strip())


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM (Linux)")
def test_write_peak_memory_stays_flat_from_20k_to_200k_files(tmp_path: Path) -> None:
    """Ten times the files, same peak RSS within 25%: nothing holds all entries.

    Holding them (the whole listing as Python objects) added ~600 bytes per
    file: 120 MB more at 200k, where the 20k run peaks at ~60 MB.
    """
    small = _peak_kb(_tree_listing(tmp_path, 20_000), str(tmp_path / "out20k"))
    large = _peak_kb(_tree_listing(tmp_path, 200_000), str(tmp_path / "out200k"))
    assert large <= 1.25 * small, f"peak RSS {small} kB at 20k files, {large} kB at 200k"


@pytest.mark.parametrize("token", ["sha256:zz", "sha256:00{hex}", "sha256:{upper}", "sha256:"])
def test_a_sha256_token_that_is_not_64_hex_digits_is_one_line(
    listed: Path, tmp_path: Path, loop: str, token: str
) -> None:
    line = (listed / "files.jsonl").read_bytes().split(b"\n")[2]
    real = json.loads(line)["token"]
    hexdigits = real.removeprefix("sha256:")
    bad = token.format(hex=hexdigits, upper=hexdigits.upper())
    edit_listing_line(listed, 2, real.encode(), bad.encode())
    config = WriteConfig(out=str(tmp_path / "out"), num_shards=3)
    wrong = rf"files\.jsonl:3: expected 'token' sha256: and 64 lowercase hex digits, found '{bad}'$"
    with pytest.raises(InputError, match=wrong):
        write(config, str(listed), progress=False)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("manifest.json"))


def test_a_listing_in_memory_with_a_short_sha256_token_is_one_line(listed: Path, tmp_path: Path):
    listing = read_listing(str(listed))
    entries = list(listing.entries)
    entries[1] = entries[1]._replace(token="sha256:abcd")
    config = WriteConfig(out=str(tmp_path / "out"), num_shards=3)
    with pytest.raises(
        InputError, match=r"listed token: expected 'token' sha256: and 64 lowercase"
    ):
        write(config, dataclasses.replace(listing, entries=tuple(entries)), progress=False)


@pytest.mark.parametrize("grown", [False, True])
def test_a_path_listed_twice_is_one_line_naming_it(
    listed: Path, tmp_path: Path, loop: str, grown: bool
) -> None:
    config = WriteConfig(out=str(tmp_path / "out"), num_shards=3)
    if grown:  # grown from a version of the clean listing (the C match hands it back)
        write(config, str(listed), progress=False)
        config = dataclasses.replace(
            config, previous=str(next((tmp_path / "out").rglob("manifest.json")))
        )
    lines = (listed / "files.jsonl").read_bytes().split(b"\n")
    edit_listing_line(listed, 4, lines[4], lines[3])  # line 4 again as line 5
    path = json.loads(lines[3])["path"]
    wrong = rf"files\.jsonl:5: expected each path once and after the line before .* found {path!r}"
    with pytest.raises(InputError, match=wrong):
        write(config, str(listed), progress=False)
