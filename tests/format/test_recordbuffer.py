"""Records laid out in place: the same bytes as encode + frame, files that changed, flushing."""

from __future__ import annotations

import hashlib
import random

import pytest

from tfshards.format.example import encode
from tfshards.format.recordbuffer import FileChanged, RecordBuffer, copy_into, read_local_into
from tfshards.format.tfrecord import frame, scan
from tfshards.listing.entry import Entry


class Collect:
    """A flush target that keeps a copy of every view it is given."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def __call__(self, view: memoryview) -> None:
        self.parts.append(bytes(view))

    @property
    def data(self) -> bytes:
        return b"".join(self.parts)


def _reference(image_feature: str, payload: bytes, label: int, path: bytes) -> bytes:
    features = {
        image_feature: ("bytes", [payload]),
        "label": ("int64", [label]),
        "path": ("bytes", [path]),
        "sha256": ("bytes", [hashlib.sha256(payload).hexdigest().encode()]),
    }
    return b"".join(frame(encode(features)[0]))


# "image" sorts first; "m_img" between label and path; "q" between path and sha256; "zz" last
@pytest.mark.parametrize("image_feature", ["image", "a", "m_img", "q", "zz"])
@pytest.mark.parametrize("size", [1, 127, 128, 16_383, 16_384, 72_000, (1 << 21) + 5])
def test_laid_out_record_equals_encode_then_frame(image_feature, size):
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    out = Collect()
    records = RecordBuffer(out, image_feature, capacity=64 << 10)
    cases = [(0, b"a"), (127, b"d/" + b"x" * 125), (128, b"p" * 128), (300, b"q" * 300)]
    for label, path in cases:
        records.add_file(size, label, path, copy_into, payload)
    records.flush()
    assert out.data == b"".join(_reference(image_feature, payload, lb, p) for lb, p in cases)


def test_small_buffer_flushes_whole_records_in_order():
    out = Collect()
    records = RecordBuffer(out, "image", capacity=1000)
    payloads = [bytes([i]) * (100 + 37 * i) for i in range(40)]
    for i, payload in enumerate(payloads):
        records.add_file(len(payload), i % 3, f"{i}.jpg".encode(), copy_into, payload)
    records.append(frame([b"extra record"]))
    records.flush()
    assert len(out.parts) > 5
    for part in out.parts:  # every flush ends on a record boundary
        assert all(s.problem is None for s in scan(part))
    scanned = list(scan(out.data))
    assert len(scanned) == 41
    assert bytes(scanned[-1].data or b"") == b"extra record"


@pytest.mark.parametrize(
    ("written", "listed", "found"),
    [(b"x" * 10, 9, 10), (b"x" * 10, 11, 10), (b"", 5, 0), (b"", 0, 0), (b"y" * 5000, 4, 5000)],
)
def test_a_file_that_changed_since_listing_raises_with_its_size(tmp_path, written, listed, found):
    path = tmp_path / "f.jpg"
    path.write_bytes(written)
    out = Collect()
    records = RecordBuffer(out, "image")
    with pytest.raises(FileChanged) as info:
        records.add_file(listed, 0, b"f.jpg", read_local_into, str(path))
    assert info.value.found == found
    records.flush()
    assert out.data == b""  # nothing of the bad record is kept


def test_local_read_matches_in_memory_bytes(tmp_path):
    payload = bytes(range(256)) * 300
    (tmp_path / "a.jpg").write_bytes(payload)
    local, memory = Collect(), Collect()
    for out, read_into, source in [
        (local, read_local_into, str(tmp_path / "a.jpg")),
        (memory, copy_into, payload),
    ]:
        records = RecordBuffer(out, "image")
        records.add_file(len(payload), 2, b"a.jpg", read_into, source)
        records.flush()
    assert local.data == memory.data == _reference("image", payload, 2, b"a.jpg")


@pytest.mark.parametrize("image_feature", ["image", "a", "m_img", "q", "zz"])
def test_local_files_framed_in_bulk_equal_encode_then_frame(tmp_path, loop, image_feature):
    rng = random.Random(0)
    sizes = [1, 127, 128, 16_383, 16_384, 72_000, 300_000]  # 300 KB: the 64 KB buffer grows
    labels = [0, 127, 128, 300, 1 << 40]
    entries, expected = [], []
    for i, size in enumerate(sizes * 3):
        # paths of 8 to ~150 bytes; not image names, so random bytes pass (no format check)
        rel = f"d{i % 2}/" + "x" * (i * 13 % 140) + f"{i}.bin"
        payload = rng.randbytes(size)
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_bytes(payload)
        entries.append(Entry(rel, size, labels[i % 5], ""))
        expected.append(_reference(image_feature, payload, labels[i % 5], rel.encode()))
    out = Collect()
    records = RecordBuffer(out, image_feature, capacity=64 << 10)
    assert list(records.add_local_files(f"{tmp_path}/", entries)) == []
    records.flush()
    assert out.data == b"".join(expected)
    assert len(out.parts) > 3
    for part in out.parts:  # every flush ends on a record boundary
        assert all(s.problem is None for s in scan(part))


_LISTED = [("a", 0, 10), ("b", 1, 3), ("c", 2, 5), ("d", 3, 10), ("e", 4, 9), ("f", 5, 7)]


def test_files_that_cannot_be_framed_are_reported_and_passed_over(tmp_path, loop):
    written = {"a": b"a" * 10, "c": b"", "d": b"d" * 20, "e": b"e" * 5, "f": b"f" * 7}
    for name, data in written.items():
        (tmp_path / name).write_bytes(data)
    listed = [Entry(n, size, label, "") for n, label, size in _LISTED]
    out = Collect()
    records = RecordBuffer(out, "image")
    problems = list(records.add_local_files(f"{tmp_path}/", listed))
    records.flush()
    assert [i for i, _ in problems] == [1, 2, 3, 4]
    assert isinstance(problems[0][1], FileNotFoundError)
    assert problems[0][1].strerror == "No such file or directory"
    assert [p.found for _, p in problems[1:]] == [0, 20, 5]  # type: ignore[union-attr]
    good = [_reference("image", written[n], label, n.encode()) for n, label in (("a", 0), ("f", 5))]
    assert out.data == b"".join(good)  # nothing of the bad files is kept


def test_a_missing_root_reports_every_file(tmp_path, loop):
    records = RecordBuffer(Collect(), "image")
    problems = list(
        records.add_local_files(f"{tmp_path}/gone/", [Entry("a", 1, 0, ""), Entry("b", 2, 0, "")])
    )
    assert [(i, type(p)) for i, p in problems] == [(0, FileNotFoundError), (1, FileNotFoundError)]


def test_a_record_larger_than_the_buffer_by_its_keys_alone_still_fits(tmp_path, loop):
    feature = "k" * 5000  # the payload's key alone is larger than the whole buffer
    (tmp_path / "a.bin").write_bytes(b"abc")
    out = Collect()
    records = RecordBuffer(out, feature, capacity=1024)
    assert list(records.add_local_files(f"{tmp_path}/", [Entry("a.bin", 3, 1, "")])) == []
    records.flush()
    assert out.data == _reference(feature, b"abc", 1, b"a.bin")
