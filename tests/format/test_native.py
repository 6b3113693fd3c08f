"""The compiled loops (tfshards.format._native) agree with the Python ones, byte for byte.

Every caller falls back to Python where the extension is not built, so both
paths must write the same shards and find the same problems. The tests of
the callers (test_recordbuffer, test_recordcheck) run both paths; these check
the C functions themselves and a whole write in both modes.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from tfshards.format import native
from tfshards.format.tfrecord import frame, scan

C = native.NATIVE
needs_c = pytest.mark.skipif(C is None, reason="tfshards.format._native is not built")


def _can_build() -> bool:
    include = sysconfig.get_paths()["include"]
    return bool(
        shutil.which("cc")
        and Path(include, "Python.h").exists()
        and Path("/usr/include/openssl/sha.h").exists()
    )


@pytest.mark.skipif(not _can_build(), reason="no C compiler, Python or OpenSSL headers")
def test_the_extension_is_built_where_it_can_be():
    if os.environ.get("TFSHARDS_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("TFSHARDS_PURE_PYTHON is set")
    assert C is not None, "setup.py did not build tfshards.format._native (see the install log)"


def test_scan_frames_walks_the_records_and_stops_where_scan_finds_a_framing_problem():
    records = [b"".join(frame([bytes([i]) * (i * 37)])) for i in range(50)]
    whole = b"".join(records)
    offsets = np.cumsum([0] + [len(r) for r in records])
    if C is None:
        pytest.skip("tfshards.format._native is not built")
    found, data_ok, end = C.scan_frames(whole)
    assert np.frombuffer(found, np.int64).tolist() == offsets[:-1].tolist()
    assert (data_ok, end) == (b"\x01" * 50, len(whole))
    cut = whole[:-3]  # the last record loses part of its footer
    found, _, end = C.scan_frames(cut)
    assert np.frombuffer(found, np.int64).tolist() == offsets[:-2].tolist()
    assert end == offsets[-2]
    bad_length = bytearray(whole)
    bad_length[offsets[7] + 9] ^= 1  # record 7's length CRC
    found, _, end = C.scan_frames(bytes(bad_length))
    assert (len(found) // 8, end) == (7, offsets[7])
    bad_data = bytearray(whole)
    bad_data[offsets[9] + 13] ^= 1  # record 9's data
    assert C.scan_frames(bytes(bad_data))[1] == b"\x01" * 9 + b"\x00" + b"\x01" * 40
    assert C.scan_frames(b"") == (b"", b"", 0)


@needs_c
def test_frame_offsets_walks_the_lengths_and_stops_before_a_cut_record():
    assert C is not None
    records = [b"".join(frame([bytes([i]) * (i * 37)])) for i in range(50)]
    whole = b"".join(records)
    offsets = np.cumsum([0] + [len(r) for r in records])
    found, end = C.frame_offsets(whole)
    assert np.frombuffer(found, np.int64).tolist() == offsets[:-1].tolist()
    assert end == len(whole)
    cut = whole[:-3]  # the last record loses its footer
    found, end = C.frame_offsets(cut)
    assert np.frombuffer(found, np.int64).tolist() == offsets[:-2].tolist()
    assert end == offsets[-2]
    assert C.frame_offsets(b"") == (b"", 0)


def _write(tmp_path: Path, name: str, pure: bool) -> Path:
    """``tfshards write`` of the same tree in a fresh interpreter; returns the version folder."""
    env = {**os.environ, "TFSHARDS_PURE_PYTHON": "1" if pure else "0"}
    out = tmp_path / name
    listing = tmp_path / "listing"
    subprocess.run(
        [sys.executable, "-m", "tfshards", "write", str(listing), "--out", str(out),
         "--workers", "2", "--num-shards", "3", "--on-error", "skip",
         "--manifest", str(tmp_path / f"{name}.json")],
        check=True, env=env, capture_output=True, cwd=tmp_path,
    )  # fmt: skip
    (version,) = [p for p in out.iterdir() if p.is_dir()]
    return version


@needs_c
def test_a_whole_write_is_byte_identical_with_and_without_the_extension(tmp_path):
    rng = random.Random(3)
    raw = tmp_path / "raw"
    for i in range(60):
        size = rng.choice([1, 127, 128, 5000, 70_000, 200_000])
        path = raw / f"class_{i % 3}" / f"{i:03d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        # a JPEG's start, scan and end markers: whole to both paths
        path.write_bytes(b"\xff\xd8\xff\xda" + rng.randbytes(size) + b"\xff\xd9")
    (raw / "class_1" / "empty.jpg").write_bytes(b"")  # rejected by both paths
    (raw / "class_2" / "text.jpg").write_bytes(b"not an image")  # rejected by both paths
    (raw / "class_0" / "cut.jpg").write_bytes(b"\xff\xd8\xff\xda" + rng.randbytes(900))  # too
    subprocess.run(
        [sys.executable, "-m", "tfshards", "list", str(raw), "--out", str(tmp_path / "listing")],
        check=True, capture_output=True, cwd=tmp_path,
    )  # fmt: skip
    c, py = _write(tmp_path, "c", pure=False), _write(tmp_path, "py", pure=True)
    names = sorted(str(p.relative_to(c)) for p in c.rglob("*") if p.is_file())
    assert names == sorted(str(p.relative_to(py)) for p in py.rglob("*") if p.is_file())
    assert len([n for n in names if n.endswith(".tfrecord")]) == 3
    for name in names:
        if name != "manifest.json":  # its ``root`` names the folder
            assert (c / name).read_bytes() == (py / name).read_bytes(), name
    records = sum(1 for p in c.glob("*.tfrecord") for _ in scan(p.read_bytes()))
    assert records == 60
    assert b"empty.jpg" in (c / "manifest.json").read_bytes()
    assert b"text.jpg" in (c / "manifest.json").read_bytes()
    assert b"cut.jpg" in (c / "manifest.json").read_bytes()


@needs_c
def test_read_lines_joins_the_lines_by_number_and_names_the_first_bad_offset(
    tmp_path: Path,
) -> None:
    assert C is not None
    lines = [b'{"a":%d}' % i + b" " * i for i in range(50)]
    text = b"".join(line + b"\n" for line in lines)
    starts = np.cumsum([0] + [len(line) + 1 for line in lines], dtype="<u8")
    (tmp_path / "files.jsonl").write_bytes(text)
    (tmp_path / "files.idx").write_bytes(starts.tobytes())
    order = np.array([7, 0, 49, 7, 3], dtype=np.uint32)
    with open(tmp_path / "files.idx", "rb") as idx, open(tmp_path / "files.jsonl", "rb") as f:
        joined, bad = C.read_lines(idx.fileno(), f.fileno(), order.tobytes())
        assert (joined, bad) == (b"[" + b",".join(lines[j] for j in order) + b"]", -1)
        assert C.read_lines(idx.fileno(), f.fileno(), b"") == (b"[]", -1)
        shifted = starts.copy()
        shifted[3] += 1  # line 3 starts inside line 2's text
        (tmp_path / "files.idx").write_bytes(shifted.tobytes())
        assert C.read_lines(idx.fileno(), f.fileno(), order.tobytes()) == (b"", 4)
        past = np.array([0, 60], dtype=np.uint32)  # no offsets there
        assert C.read_lines(idx.fileno(), f.fileno(), past.tobytes()) == (b"", 1)


def _listing_line(label: int, path: str, token: str) -> bytes:
    return b'{"label":"L%d","label_index":%d,"path":"%s","size":1,"token":"%s"}\n' % (
        label,
        label,
        path.encode(),
        token.encode(),
    )


@needs_c
def test_match_members_finds_each_member_line_in_the_listing_or_says_none():
    assert C is not None
    listing = b"".join(_listing_line(i % 2, f"p{i}.png", f"t{i}") for i in range(6))
    keep = [b"0", b"1"]
    first = b'["p4.png","t4",0]\n["p1.png","t1",1]\n'
    changed = b'["p2.png","t9",0]\n'  # another token
    relabeled = b'["p3.png","t3",0]\n'  # listed under label 1
    no_newline = b'["p5.png","t5",1]'
    found = C.match_members(listing, 6, keep, [first, changed, relabeled, b"", no_newline])
    assert found is not None
    assert np.frombuffer(found[0], np.int32).tolist() == [4, 1]
    assert found[1] is None and found[2] is None
    assert found[3] == b"" and np.frombuffer(found[4], np.int32).tolist() == [5]
    # A label no kept record carries (b"-1") matches nothing.
    assert C.match_members(listing, 6, [b"0", b"-1"], [first])[0] is None


@needs_c
@pytest.mark.parametrize(
    "listing, files",
    [
        (_listing_line(0, 'q\\"uote.png', "t"), 1),  # an escaped character: Python decodes
        (_listing_line(0, "a.png", "t"), 2),  # fewer lines than files
        (_listing_line(3, "a.png", "t"), 1),  # a label index beyond keep
        (_listing_line(0, "a.png", "t").replace(b"}", b',"x":1}'), 1),  # an extra column
        (_listing_line(0, "b.png", "t") + _listing_line(0, "a.png", "u"), 2),  # out of order
        (_listing_line(0, "a.png", "t") * 2, 2),  # a path twice
    ],
)
def test_match_members_gives_up_on_a_listing_that_is_not_plain(listing, files):
    assert C is not None
    assert C.match_members(listing, files, [b"0"], [b'["a.png","t",0]\n']) is None
