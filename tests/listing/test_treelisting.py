"""``list_to`` (streamed to disk) writes exactly what ``write_listing(list_files(...))`` writes."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest

from tfshards.errors import InputError
from tfshards.listing import hashcache, treelisting
from tfshards.listing.listing import list_files, write_listing
from tfshards.listing.treelisting import list_to

# Names whose path order differs from a per-folder or per-label order, and
# names JSON escapes; every value is the file's bytes.
TREE = {
    "a/y.jpeg": b"a",
    "a b/x.jpg": b"ab",  # " " < "/": before a/
    "a-b/z.jpg": b"a-b",  # "-" < "/": before a/
    "a/b/c.jpg": b"abc",
    "a/b.jpg": b"ab.",  # "a/b.jpg" < "a/b/c.jpg": "." < "/"
    "a/b-c.jpg": b"b-c",
    "a/b0.jpg": b"b0",  # "0" > "/": after a/b/
    "cat/001.jpg": b"c1",
    "cat/sub/002.JPG": b"c22",
    "cat/.hidden.jpg": b"h",
    "cat/notes.txt": b"t",
    'dog/quote"d.png': b"q",
    "dog/back\\slash.png": b"bs",
    "dog/tab\there.png": b"tab",
    "dog/new\nline.png": b"nl",
    "dog/ä ö ü.png": b"d2",
    "dog/Σ.jpg": b"sigma",
    "dog/deep/er/still/x.png": b"deep",
    "loose.jpg": b"no label",
}


def _make(root: Path, tree: Mapping[str, bytes]) -> str:
    for rel, data in tree.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return str(root)


def _read(out: Path) -> tuple[bytes, bytes, bytes]:
    return tuple((out / name).read_bytes() for name in ("files.jsonl", "files.idx", "meta.json"))  # type: ignore[return-value]


def _same(root: str, tmp_path: Path, **kw: object) -> None:
    write_listing(list_files(root, **kw), str(tmp_path / "memory"))  # type: ignore[arg-type]
    summary = list_to(root, str(tmp_path / "streamed"), **kw)  # type: ignore[arg-type]
    assert _read(tmp_path / "streamed") == _read(tmp_path / "memory")
    listing = list_files(root, **kw)  # type: ignore[arg-type]
    assert summary.files == len(listing.entries)
    assert summary.files_per_label == listing.files_per_label()
    assert summary.labels == listing.labels
    assert summary.skipped == dict(listing.skipped)
    assert summary.digest == listing.digest
    assert summary.total_bytes == listing.total_bytes


@pytest.mark.usefixtures("loop")
@pytest.mark.parametrize("cache", [False, True])
def test_streamed_listing_is_byte_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: bool
) -> None:
    monkeypatch.setattr(hashcache, "RACY_NS", 0)
    root = _make(tmp_path / "raw", TREE)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "linked.jpg").write_bytes(b"linked")
    os.symlink(elsewhere / "linked.jpg", tmp_path / "raw" / "cat" / "link.jpg")
    os.symlink(elsewhere, tmp_path / "raw" / "cat" / "linked-folder")
    os.symlink(tmp_path / "missing.jpg", tmp_path / "raw" / "cat" / "dangling.jpg")
    kw = {"hash_cache": str(tmp_path / "hashes.sqlite")} if cache else {}
    _same(root, tmp_path / "1", **kw)
    _same(root, tmp_path / "2", **kw)  # a warm cache the second time
    _same(root, tmp_path / "3", glob="*/b*", **kw)
    _same(root, tmp_path / "4", extensions=["*"], **kw)


@pytest.mark.usefixtures("loop")
def test_a_label_folder_with_every_file_skipped_is_no_label(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _make(tmp_path / "raw", {"a/x.txt": b"t", "b/y.jpg": b"y", "c/z.jpg": b"z"})

    def in_memory(*args: object, **kw: object) -> None:
        raise AssertionError("a local tree is streamed, walked twice at most")

    monkeypatch.setattr(treelisting, "list_files", in_memory)
    _same(root, tmp_path)
    assert (tmp_path / "streamed" / "files.jsonl").read_text().count('"label_index":0') == 1


@pytest.mark.usefixtures("loop")
def test_nothing_to_list_is_the_same_error_and_writes_nothing(tmp_path: Path) -> None:
    root = _make(tmp_path / "raw", {"a/x.txt": b"t", ".hidden/y.jpg": b"y"})
    with pytest.raises(InputError) as memory:
        list_files(root)
    with pytest.raises(InputError) as streamed:
        list_to(root, str(tmp_path / "out"))
    assert str(streamed.value) == str(memory.value)
    assert not (tmp_path / "out").exists()


def test_index_and_other_storage_go_through_the_listing_in_memory(tmp_path: Path) -> None:
    root = _make(tmp_path / "raw", {"a/x.jpg": b"x", "b/y.jpg": b"y"})
    index = tmp_path / "index.csv"
    index.write_text("path,label\na/x.jpg,one\nb/y.jpg,two\n", encoding="utf-8")
    _same(root, tmp_path, index=str(index))


def test_label_folders_of_one_name_in_two_unicode_forms_are_refused(tmp_path):
    """NFC 'café' and NFD 'cafe' + U+0301 print alike: they were two labels, two outputs."""
    raw = tmp_path / "raw"
    for name in ("caf\u00e9", "cafe\u0301", "dog"):
        (raw / name).mkdir(parents=True)
        (raw / name / "a.png").write_bytes(name.encode())
    said = (
        f"{raw}: label folders 'cafe\\u0301' and 'caf\\xe9' are one name, 'caf\u00e9', in "
        "two Unicode forms (NFC and NFD), so they print alike but would be two labels: "
        "rename one to the other's form, or merge them"
    )
    for listed in (lambda: list_files(str(raw)), lambda: list_to(str(raw), str(tmp_path / "l"))):
        with pytest.raises(InputError) as refused:
            listed()
        assert str(refused.value) == said
    assert not (tmp_path / "l").exists()
