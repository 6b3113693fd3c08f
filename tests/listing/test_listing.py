"""Listing a tree (local disk and memory://), index files, filters, skips and errors."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import fsspec
import pytest

from tfshards.errors import ConfigError, InputError
from tfshards.listing.entry import Entry
from tfshards.listing.listing import (
    Listing,
    list_files,
    listing_digest,
    read_listing,
    write_listing,
)

# label folders, files beside them, nesting, odd names; every value is the file's bytes
TREE = {
    "cat/001.jpg": b"c1",
    "cat/sub/002.JPG": b"c22",
    "dog/001.png": b"d111",
    "dog/ä ö ü.png": b"d2",
    "a b/x.jpg": b"ab",  # ' ' sorts before '/', so "a b/x.jpg" < "a/..." by codepoint
    "a/y.jpeg": b"a",
}
Make = Callable[[Mapping[str, bytes]], str]


def _write_tree(fs: fsspec.AbstractFileSystem, base: str, tree: Mapping[str, bytes]) -> None:
    for rel, data in tree.items():
        path = f"{base}/{rel}"
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, data)


@pytest.fixture
def local_tree(tmp_path: Path) -> Make:
    def make(tree: Mapping[str, bytes]) -> str:
        root = tmp_path / "raw"
        root.mkdir(exist_ok=True)
        _write_tree(fsspec.filesystem("file"), str(root), tree)
        return str(root)

    return make


@pytest.fixture
def memory_tree() -> Make:
    def make(tree: Mapping[str, bytes]) -> str:
        _write_tree(fsspec.filesystem("memory"), "/raw", tree)
        return "memory://raw"

    return make


@pytest.fixture(params=["local", "memory"])
def make_tree(request: pytest.FixtureRequest, local_tree: Make, memory_tree: Make) -> Make:
    return local_tree if request.param == "local" else memory_tree


def _without_tokens(listing: Listing) -> list[tuple[str, int, int]]:
    return [(e.path, e.size, e.label) for e in listing.entries]


def test_folder_labels_sizes_and_codepoint_order(make_tree: Make) -> None:
    listing = list_files(make_tree(TREE))
    assert listing.labels == ("a", "a b", "cat", "dog")
    assert _without_tokens(listing) == [
        ("a b/x.jpg", 2, 1),
        ("a/y.jpeg", 1, 0),
        ("cat/001.jpg", 2, 2),
        ("cat/sub/002.JPG", 3, 2),
        ("dog/001.png", 4, 3),
        ("dog/ä ö ü.png", 2, 3),
    ]
    assert all(isinstance(e, Entry) and e.token for e in listing.entries)
    assert listing.total_bytes == 14
    assert listing.files_per_label() == {"a": 1, "a b": 1, "cat": 2, "dog": 2}


def test_local_and_memory_give_the_same_files_jsonl_apart_from_tokens(
    local_tree: Make, memory_tree: Make, tmp_path: Path
) -> None:
    local, memory = list_files(local_tree(TREE)), list_files(memory_tree(TREE))
    assert _without_tokens(local) == _without_tokens(memory)
    assert local.labels == memory.labels and local.skipped == memory.skipped
    blank = [e._replace(token="") for e in local.entries]
    assert listing_digest(Listing("x", local.labels, tuple(blank), local.skipped)) == (
        listing_digest(
            Listing("y", memory.labels, tuple(e._replace(token="") for e in memory.entries))
        )
    )


def test_same_tree_writes_identical_bytes_every_run(make_tree: Make, tmp_path: Path) -> None:
    root = make_tree(TREE)
    write_listing(list_files(root), str(tmp_path / "one"))
    write_listing(list_files(root), str(tmp_path / "two"))
    for name in ("files.jsonl", "meta.json"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def test_written_listing_is_canonical_json_and_reads_back(make_tree: Make, tmp_path: Path) -> None:
    listing = list_files(make_tree(TREE))
    write_listing(listing, str(tmp_path / "out"))
    lines = (tmp_path / "out" / "files.jsonl").read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    assert lines[0] == json.dumps(first, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    assert first == {
        "label": "a b",
        "label_index": 1,
        "path": "a b/x.jpg",
        "size": 2,
        "token": listing.entries[0].token,
    }
    assert "ä ö ü" in lines[-1]  # ensure_ascii=False: names stay readable
    meta_text = (tmp_path / "out" / "meta.json").read_text(encoding="utf-8")
    meta = json.loads(meta_text)
    assert meta_text.endswith("}\n")
    assert meta["version"] == 2 and meta["files"] == 6 and meta["bytes"] == 14
    assert meta["files_per_label"] == {"a": 1, "a b": 1, "cat": 2, "dog": 2}
    assert meta["files_sha256"] == listing_digest(listing)
    assert read_listing(str(tmp_path / "out")) == listing


def test_listing_round_trips_through_memory_storage(memory_tree: Make) -> None:
    listing = list_files(memory_tree(TREE))
    write_listing(listing, "memory://listing")
    assert read_listing("memory://listing") == listing


def test_root_keeps_url_and_loses_trailing_slash(memory_tree: Make) -> None:
    memory_tree(TREE)
    assert list_files("memory://raw/").root == "memory://raw"


def test_hidden_top_level_and_non_image_files_are_counted_not_dropped(make_tree: Make) -> None:
    root = make_tree(
        {
            **TREE,
            ".git/objects/x.jpg": b"x",  # a hidden folder counts once, unvisited
            "cat/.thumb.jpg": b"x",
            "dog/.cache/y.png": b"x",
            "top.jpg": b"x",
            "README.md": b"x",
            "cat/notes.txt": b"x",
            "dog/no_suffix": b"x",
        }
    )
    listing = list_files(root)
    assert len(listing.entries) == 6
    assert listing.skipped == {
        "hidden": 3,
        "extension": 3,
        "glob": 0,
        "no-label": 1,
        "not-a-file": 0,
    }


def test_extensions_are_case_insensitive_with_or_without_dot(make_tree: Make) -> None:
    root = make_tree(TREE)
    assert [e.path for e in list_files(root, extensions=["JPG"]).entries] == [
        "a b/x.jpg",
        "cat/001.jpg",
        "cat/sub/002.JPG",
    ]
    assert list_files(root, extensions=[".PNG"]).skipped["extension"] == 4


@pytest.mark.parametrize("extensions", [".tar.gz", "*.jpg", "j?g"])
def test_an_extension_no_last_suffix_can_be_is_refused(make_tree: Make, extensions) -> None:
    """A file's last suffix is matched: ".tar.gz" kept nothing, silently."""
    with pytest.raises(ConfigError, match=r"expected one suffix \(\.jpg\), found "):
        list_files(make_tree({"a/x.tar.gz": b"1"}), extensions=[extensions])


def test_folders_nested_deeper_than_the_walk_goes_are_one_line(tmp_path: Path) -> None:
    """~1,000 levels met Python's recursion limit with a RecursionError."""
    from tfshards.listing.sortedwalk import MAX_DEPTH

    deep = tmp_path / "root" / "a"
    deep.mkdir(parents=True)
    fd = os.open(deep, os.O_RDONLY)
    try:  # relative to an open folder: each call's path stays short
        for _ in range(MAX_DEPTH + 2):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        os.close(os.open("x.jpg", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    finally:
        os.close(fd)
    with pytest.raises(InputError, match=rf"expected at most {MAX_DEPTH} folder levels below"):
        list_files(str(tmp_path / "root"))


def test_a_folder_reached_twice_through_links_is_one_line(tmp_path: Path) -> None:
    """Links to links were walked once per path: 15 files listed as 32,767 entries."""
    outside = tmp_path / "outside"
    for i in range(3):
        (outside / f"e{i}").mkdir(parents=True)
        (outside / f"e{i}" / "f.jpg").write_bytes(bytes([i]))
    for i in range(2):  # e0 -> e1 twice, e1 -> e2 twice
        (outside / f"e{i}" / "l1").symlink_to(outside / f"e{i + 1}")
        (outside / f"e{i}" / "l2").symlink_to(outside / f"e{i + 1}")
    (tmp_path / "root" / "a").mkdir(parents=True)
    (tmp_path / "root" / "a" / "in").symlink_to(outside / "e0")
    with pytest.raises(InputError, match=r"/a/in/l2: expected each folder once, found it also as "):
        list_files(str(tmp_path / "root"))


def test_star_or_none_keeps_every_extension(make_tree: Make) -> None:
    root = make_tree({"a/x.txt": b"1", "a/y": b"2"})
    assert len(list_files(root, extensions=None).entries) == 2
    assert len(list_files(root, extensions=["*"]).entries) == 2


def test_glob_matches_relative_path_and_counts_the_rest(make_tree: Make) -> None:
    listing = list_files(make_tree(TREE), glob="*/0*")
    assert [e.path for e in listing.entries] == ["cat/001.jpg", "cat/sub/002.JPG", "dog/001.png"]
    assert listing.skipped["glob"] == 3
    assert listing.labels == ("cat", "dog")  # folders left without files are no labels


def test_empty_label_folder_is_not_a_label(local_tree: Make) -> None:
    root = local_tree(TREE)
    os.mkdir(os.path.join(root, "empty"))
    assert "empty" not in list_files(root).labels


def test_symlinked_files_and_folders_are_followed(local_tree: Make, tmp_path: Path) -> None:
    root = Path(local_tree({"cat/1.jpg": b"1"}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "2.jpg").write_bytes(b"22")
    (root / "cat" / "linked.jpg").symlink_to(elsewhere / "2.jpg")
    (root / "dog").symlink_to(elsewhere, target_is_directory=True)
    (root / "cat" / "dangling.jpg").symlink_to(tmp_path / "missing.jpg")
    listing = list_files(str(root))
    assert [(e.path, e.size) for e in listing.entries] == [
        ("cat/1.jpg", 1),
        ("cat/linked.jpg", 2),
        ("dog/2.jpg", 2),
    ]
    assert listing.skipped["not-a-file"] == 1


def test_a_link_to_another_label_folder_is_refused_naming_both_labels(
    local_tree: Make, tmp_path: Path
) -> None:
    root = Path(local_tree({"circle/1.jpg": b"c", "triangle/1.jpg": b"t"}))
    (root / "triangle" / "loop").symlink_to("../circle", target_is_directory=True)
    with pytest.raises(InputError) as info:
        list_files(str(root))
    assert str(info.value).startswith(
        f"{root / 'triangle' / 'loop'}: linked folder: expected a folder of label 'triangle', "
        "found a link to label folder 'circle'"
    )
    (root / "triangle" / "loop").unlink()
    (root / "square").symlink_to(root / "circle", target_is_directory=True)
    with pytest.raises(InputError, match="expected a folder of label 'square'"):
        list_files(str(root))
    (root / "square").unlink()
    (root / "triangle" / "all").symlink_to(root, target_is_directory=True)
    with pytest.raises(InputError, match="found a link to the root itself"):
        list_files(str(root))


def test_symlink_loop_is_an_error_naming_the_link(local_tree: Make) -> None:
    root = Path(local_tree({"cat/1.jpg": b"1"}))
    (root / "cat" / "loop").symlink_to(root / "cat", target_is_directory=True)
    with pytest.raises(InputError, match=r"cat/loop: symlink loop"):
        list_files(str(root))


def test_name_that_is_not_utf8_is_an_error(local_tree: Make) -> None:
    root = local_tree({"cat/1.jpg": b"1"})
    with open(os.path.join(os.fsencode(root), b"cat", b"bad\xff.jpg"), "wb") as f:
        f.write(b"x")
    with pytest.raises(InputError, match="expected valid UTF-8"):
        list_files(root)


def test_unicode_line_separator_in_a_name_survives_the_round_trip(
    local_tree: Make, tmp_path: Path
) -> None:
    listing = list_files(local_tree({"cat/a\u2028b.jpg": b"1", "cat/new\nline.jpg": b"2"}))
    write_listing(listing, str(tmp_path / "out"))
    assert read_listing(str(tmp_path / "out")) == listing


# --- index files -----------------------------------------------------------------------


def test_csv_index_sets_labels_and_ignores_other_columns(make_tree: Make, tmp_path: Path) -> None:
    root = make_tree(TREE)
    index = tmp_path / "index.csv"
    index.write_text(
        "split,path,label\ntrain,./cat/001.jpg,pet\ntrain,dog/001.png,pet\nval,a/y.jpeg,letter\n",
        encoding="utf-8",
    )
    listing = list_files(root, index=str(index))
    assert listing.labels == ("letter", "pet")
    assert _without_tokens(listing) == [
        ("a/y.jpeg", 1, 0),
        ("cat/001.jpg", 2, 1),
        ("dog/001.png", 4, 1),
    ]


def test_jsonl_index_accepts_integer_labels(make_tree: Make, tmp_path: Path) -> None:
    root = make_tree(TREE)
    index = tmp_path / "index.jsonl"
    rows = [{"path": "dog/ä ö ü.png", "label": 7}, {"path": "a b/x.jpg", "label": "7"}]
    index.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    listing = list_files(root, index=str(index))
    assert listing.labels == ("7",)
    assert [e.path for e in listing.entries] == ["a b/x.jpg", "dog/ä ö ü.png"]


def test_index_rows_are_filtered_and_counted(make_tree: Make, tmp_path: Path) -> None:
    root = make_tree({**TREE, ".hidden/z.jpg": b"z", "cat/notes.txt": b"n"})
    index = tmp_path / "index.csv"
    index.write_text(
        "path,label\n.hidden/z.jpg,x\ncat/notes.txt,x\ncat/001.jpg,x\n", encoding="utf-8"
    )
    listing = list_files(root, index=str(index))
    assert [e.path for e in listing.entries] == ["cat/001.jpg"]
    assert listing.skipped["hidden"] == 1 and listing.skipped["extension"] == 1


def test_index_on_memory_storage(memory_tree: Make) -> None:
    root = memory_tree(TREE)
    fsspec.filesystem("memory").pipe_file("/index.csv", b"path,label\ncat/sub/002.JPG,c\n")
    listing = list_files(root, index="memory://index.csv")
    assert _without_tokens(listing) == [("cat/sub/002.JPG", 3, 0)]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (
            "i.csv",
            "path,label\ncat/001.jpg,a\ncat/nope.jpg,a\n",
            r"i\.csv:3: cat/nope\.jpg: "
            r"expected a file under .*, found nothing",
        ),
        ("i.csv", "file,class\nx,y\n", r"i\.csv:1: expected a header with 'path' and 'label'"),
        ("i.csv", "", r"i\.csv:1: expected a header"),
        ("i.csv", "path,label\ncat/001.jpg, \n", r"i\.csv:2: expected a non-empty 'label'"),
        (
            "i.csv",
            "path,label\ncat/001.jpg\n",
            r"i\.csv:2: expected a non-empty 'label', found None",
        ),
        ("i.csv", "path,label\n/etc/passwd,a\n", r"i\.csv:2: expected a path relative to the root"),
        (
            "i.csv",
            "path,label\ncat/001.jpg,a\ncat/002.jpg,a,extra\n",
            r"i\.csv:3: expected 2 cells \(the header's\), found 3",
        ),
        (
            "i.csv",
            "path,label,n,n\ncat/001.jpg,a,1,2\n",
            r"i\.csv:1: expected each column named once in the header, found \['n'\] twice",
        ),
        ("i.csv", "path,label\ncat/../dog/001.png,a\n", r"i\.csv:2: .* without '\.', '\.\.'"),
        (
            "i.csv",
            "path,label\ncat/001.jpg,a\ndog/001.png,b\n./cat/001.jpg,b\n",
            r"i\.csv:4: duplicate path 'cat/001\.jpg': .* found it on lines 2 and 4",
        ),
        (
            "i.jsonl",
            '{"path": "cat/001.jpg", "label": "a"}\n{"path": "cat/001.jpg"\n',
            r"i\.jsonl:2: expected a JSON object, found invalid JSON",
        ),
        (
            "i.jsonl",
            '{"path": "cat/001.jpg", "label": "a"}\n\n{"file": "x"}\n',
            r"i\.jsonl:3: expected an object with 'path' and 'label', found \['file'\]",
        ),
        ("i.jsonl", '["cat/001.jpg", "a"]\n', r"i\.jsonl:1: .* found list"),
        (
            "i.jsonl",
            '{"path": "cat/001.jpg", "label": true}\n',
            r"i\.jsonl:1: .*'label', found True",
        ),
        (
            "i.jsonl",
            '{"path": 3, "label": "a"}\n',
            r"i\.jsonl:1: expected 'path' a string, found 3",
        ),
        ("i.jsonl", "\n", r"i\.jsonl: expected rows of path,label, found no rows"),
        (
            "i.jsonl",
            '{"path": "cat/001.jpg", "label": "\\ud800"}\n',
            r"i\.jsonl:1: expected a UTF-8 label, found '\\ud800'",
        ),
        (
            "i.jsonl",
            '{"path": "cat/001.jpg", "label": "a", "n": ' + "[" * 5000 + "]" * 5000 + "}\n",
            r"i\.jsonl:1: expected a JSON object, found values nested too deep to read",
        ),
        (  # Python reads integers of at most 4,300 digits: a ValueError and a traceback
            "i.jsonl",
            '{"path": "cat/001.jpg", "label": "a", "n": ' + "1" * 4400 + "}\n",
            r"i\.jsonl:1: expected a JSON object, found a number too long to read",
        ),
        (
            "i.txt",
            "path,label\n",
            r"i\.txt: unknown index format: expected \.csv, \.jsonl or "
            r"\.json, found '\.txt'",
        ),
    ],
)
def test_bad_index_is_an_error_naming_file_and_line(
    local_tree: Make, tmp_path: Path, name: str, content: str, message: str
) -> None:
    root = local_tree(TREE)
    index = tmp_path / name
    index.write_text(content, encoding="utf-8")
    with pytest.raises(InputError, match=message):
        list_files(root, index=str(index))


def test_index_naming_a_folder_is_an_error(make_tree: Make, tmp_path: Path) -> None:
    index = tmp_path / "i.csv"
    index.write_text("path,label\ncat/001.jpg,a\ncat/sub,a\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"i\.csv:3: cat/sub: expected a file .* found a folder"):
        list_files(make_tree(TREE), index=str(index), extensions=None)


def test_an_index_that_is_a_fifo_is_refused_not_waited_on(local_tree: Make, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.csv")  # opened for reading, it would wait for a writer forever
    with pytest.raises(InputError, match=r"fifo\.csv: cannot read index file \(expected a "):
        list_files(local_tree(TREE), index=str(tmp_path / "fifo.csv"))


def test_missing_index_file_is_an_error(local_tree: Make, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"nope\.csv: index file not found"):
        list_files(local_tree(TREE), index=str(tmp_path / "nope.csv"))


def test_index_path_missing_on_memory_storage(memory_tree: Make) -> None:
    fsspec.filesystem("memory").pipe_file("/i.jsonl", b'{"path": "cat/x.jpg", "label": "a"}\n')
    with pytest.raises(
        InputError,
        match=r"i\.jsonl:1: cat/x\.jpg: expected a file under "
        r"memory://raw, found nothing",
    ):
        list_files(memory_tree(TREE), index="memory://i.jsonl")


# --- root errors -----------------------------------------------------------------------


def test_missing_root_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"nope: root folder not found") as info:
        list_files(str(tmp_path / "nope"))
    assert info.value.path == str(tmp_path / "nope")  # type: ignore[attr-defined]
    with pytest.raises(InputError, match=r"memory://nope: root folder not found"):
        list_files("memory://nope")


def test_root_that_is_a_file_is_an_error(make_tree: Make) -> None:
    root = make_tree(TREE)
    with pytest.raises(InputError, match=r"001\.jpg: expected a folder of files, found a file"):
        list_files(root + "/cat/001.jpg")


def test_empty_root_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="expected label folders with files, found no files"):
        list_files(str(tmp_path))


def test_nothing_matching_says_what_was_skipped_and_why(make_tree: Make) -> None:
    root = make_tree({"top.jpg": b"1", "cat/a.txt": b"2", ".git/x": b"3"})
    with pytest.raises(InputError) as info:
        list_files(root, glob="cat/*")
    assert str(info.value).endswith(
        "no file to list: all 3 entries were skipped (1 hidden, 1 of another extension, "
        "1 outside the glob; kept: extensions .bmp,.gif,.jpeg,.jpg,.png,.webp, glob 'cat/*')"
    )


def test_unreadable_root_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # chmod 0 does not stop root (the CI user here), so deny access the way os.access would
    monkeypatch.setattr(os, "access", lambda *args, **kwargs: False)
    with pytest.raises(InputError, match=r": cannot read root folder \(permission denied\)"):
        list_files(str(tmp_path))


def test_password_in_url_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigError) as info:
        list_files("ftp://user:s3cret@example.com/raw")
    assert "s3cret" not in str(info.value) and "contains a password" in str(info.value)


# --- reading a listing back ------------------------------------------------------------


@pytest.fixture
def written(local_tree: Make, tmp_path: Path) -> Path:
    out = tmp_path / "listing"
    write_listing(list_files(local_tree(TREE)), str(out))
    return out


def test_malformed_listing_line_is_reported_with_file_and_line(written: Path) -> None:
    files = written / "files.jsonl"
    lines = files.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[2] = lines[2].replace('"size":2', '"size":-2')
    files.write_text("".join(lines), encoding="utf-8")
    with pytest.raises(InputError, match=r"files\.jsonl:3: expected 'size' an integer >= 0"):
        read_listing(str(written))


def test_unsorted_listing_is_reported_with_line(written: Path) -> None:
    files = written / "files.jsonl"
    lines = files.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[0], lines[1] = lines[1], lines[0]
    files.write_text("".join(lines), encoding="utf-8")
    with pytest.raises(InputError, match=r"files\.jsonl:2: expected paths sorted and unique"):
        read_listing(str(written))


def test_edited_listing_fails_the_hash_check(written: Path) -> None:
    files = written / "files.jsonl"
    files.write_text(files.read_text(encoding="utf-8").replace('"size":4', '"size":5'), "utf-8")
    with pytest.raises(InputError, match=r"expected sha256 [0-9a-f]{64} \(meta\.json\), found"):
        read_listing(str(written))


def test_truncated_listing_is_reported(written: Path) -> None:
    files = written / "files.jsonl"
    files.write_bytes(files.read_bytes()[:-1])
    with pytest.raises(InputError, match="expected a newline at the end"):
        read_listing(str(written))


@pytest.mark.parametrize("escape", ["../secret.jpg", "cat/../../secret.jpg", "ABSOLUTE", "./x.jpg"])
def test_listing_paths_that_leave_the_root_are_refused_like_index_paths(
    tmp_path: Path, escape: str
) -> None:
    """A hand-edited files.jsonl (hashes updated to match) must not make write read other files."""
    from tfshards.writing.config import WriteConfig
    from tfshards.writing.writer import write

    root = tmp_path / "raw"
    (root / "cat").mkdir(parents=True)
    (root / "cat" / "001.jpg").write_bytes(b"cat")
    secret = tmp_path / "secret.jpg"
    secret.write_bytes(b"top secret bytes")
    rel = str(secret) if escape == "ABSOLUTE" else escape
    crafted = Listing(
        str(root),
        ("cat",),
        tuple(sorted([Entry(rel, 16, 0, "t"), Entry("cat/001.jpg", 3, 0, "t")])),
    )
    write_listing(crafted, str(tmp_path / "listing"))  # files.jsonl and meta.json agree
    line = 1 + [e.path for e in crafted.entries].index(rel)
    expected = (
        rf"files\.jsonl:{line}: expected a path relative to the root "
        r"without '\.', '\.\.' or empty parts, found"
    )
    with pytest.raises(InputError, match=expected):
        read_listing(str(tmp_path / "listing"))
    config = WriteConfig(out=str(tmp_path / "out"), executor="serial", on_error="skip")
    with pytest.raises(InputError, match=expected):
        write(config, str(tmp_path / "listing"), progress=False)
    # Shard tasks check their own lines: an earlier shard may be published, never a manifest.
    assert not list((tmp_path / "out").rglob("manifest.json"))
    assert not any(b"top secret" in p.read_bytes() for p in (tmp_path / "out").rglob("*.tfrecord"))


def test_missing_or_broken_meta_is_reported(written: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="listing metadata not found"):
        read_listing(str(tmp_path / "nowhere"))
    meta = json.loads((written / "meta.json").read_text(encoding="utf-8"))
    meta["files"] = "six"
    (written / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(InputError, match=r"meta\.json: key 'files': expected int, found str"):
        read_listing(str(written))


def test_listing_validates_its_invariants() -> None:
    a, b = Entry("a.jpg", 1, 0, "t"), Entry("b.jpg", 1, 0, "t")
    with pytest.raises(ConfigError, match="sorted by unique path"):
        Listing("r", ("x",), (b, a))
    with pytest.raises(ConfigError, match=r"label id in 0\.\.0"):
        Listing("r", ("x",), (a._replace(label=1),))
    with pytest.raises(ConfigError, match="labels must be sorted and unique"):
        Listing("r", ("y", "x"), (a,))
    with pytest.raises(ConfigError, match="skipped must map"):
        Listing("r", ("x",), (a,), {"weird": 1})


def test_label_folders_listed_at_once_give_the_same_listing_and_counts(
    memory_tree: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tfshards.listing import walker

    tree = {f"l{i % 7}/d{i % 3}/{i:03d}.jpg": b"%d" % i for i in range(60)}
    tree |= {"l1/.hidden/x.jpg": b"h", "l2/notes.txt": b"t", "l3/.x.jpg": b"h"}
    root = memory_tree(tree)
    monkeypatch.setattr(walker, "REMOTE_LISTERS", 1)
    one_by_one = list_files(root)
    monkeypatch.setattr(walker, "REMOTE_LISTERS", 16)
    at_once = list_files(root)
    assert at_once == one_by_one
    assert dict(at_once.skipped) == dict(one_by_one.skipped)
    assert at_once.skipped["hidden"] == 2 and at_once.skipped["extension"] == 1
    assert len(at_once.entries) == 60 and len(at_once.labels) == 7
