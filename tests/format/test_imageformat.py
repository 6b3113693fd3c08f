"""Files named as images must hold an image: the writer (both loops) and validate refuse others."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from tfshards.cli import app
from tfshards.format import native, tfrecord
from tfshards.format.example import encode_bytes
from tfshards.format.imageformat import image_format
from tfshards.format.schema import FeatureSpec
from tfshards.listing.listing import list_files, write_listing
from tfshards.shardset.manifest import Manifest
from tfshards.validation import recordcheck

TEXT = b"just some notes, saved under the wrong name\n"
SKIP = "; write.on_error: skip leaves such files out"  # what the failed write adds
NOT_AN_IMAGE = (
    "expected an image (JPEG, PNG, GIF, BMP or WebP) as its name says, found bytes b'just som'"
)


def _image(fmt: str) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 3), (200, 10, 10)).save(out, fmt)
    return out.getvalue()


FORMATS = {"JPEG": _image("JPEG"), "PNG": _image("PNG"), "GIF": _image("GIF")}
FORMATS |= {"BMP": _image("BMP"), "WebP": _image("WEBP")}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_known_format_is_told_by_its_first_bytes(fmt):
    assert image_format(FORMATS[fmt]) == fmt
    assert image_format(FORMATS[fmt][:17]) == (None if fmt == "BMP" else fmt)


@pytest.mark.parametrize("head", [TEXT, b"", b"\xff\xd8", b"BM" + b"\0" * 30, b"RIFF1234WAVE"])
def test_text_and_near_misses_are_no_format(head):
    assert image_format(head) is None


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def _write(tmp_path: Path, files: dict[str, bytes], *more: str) -> tuple[int, str, Path]:
    raw = _tree(tmp_path / "raw", files)
    write_listing(list_files(str(raw), extensions=["*"]), str(tmp_path / "listing"))
    manifest = tmp_path / "m.json"
    result = CliRunner().invoke(
        app,
        [
            *("write", str(tmp_path / "listing"), "--out", str(tmp_path / "out")),
            *("--manifest", str(manifest), "--no-progress", "--workers", "1", *more),
        ],
    )
    return result.exit_code, result.stderr, manifest


GOOD = {f"a/{i}.jpg": FORMATS["JPEG"] for i in range(3)}


def test_text_saved_as_jpg_fails_the_write_naming_the_file(tmp_path, loop):
    code, stderr, manifest = _write(tmp_path, {**GOOD, "b/notes.jpg": TEXT})
    assert code == 1
    assert stderr == f"error: {tmp_path / 'raw'}/b/notes.jpg: {NOT_AN_IMAGE}{SKIP}\n"
    assert not manifest.exists()


def test_text_saved_as_jpg_is_rejected_with_skip_in_the_same_words_by_both_loops(tmp_path, loop):
    code, stderr, path = _write(
        tmp_path, {**GOOD, "b/notes.JPG": TEXT, "b/x.png": b"\x89PN"}, "--on-error", "skip"
    )
    assert code == 0, stderr
    manifest = Manifest.from_json(path.read_bytes())
    assert sorted((r.path, r.reason) for r in manifest.rejected) == [
        ("b/notes.JPG", NOT_AN_IMAGE),
        ("b/x.png", "expected an image (JPEG, PNG, GIF, BMP or WebP) as its name says, "
         "found bytes b'\\x89PN'"),
    ]  # fmt: skip
    assert manifest.records == 3


def test_every_format_under_any_image_name_and_any_other_name_is_written(tmp_path, loop):
    files = {f"a/{fmt}.jpeg": data for fmt, data in FORMATS.items()}  # a PNG named .jpeg too
    files |= {"a/real.png": FORMATS["PNG"], "b/notes.txt": TEXT, "b/data.npy": b"\x93NUMPY"}
    code, stderr, path = _write(tmp_path, files)
    assert code == 0, stderr
    manifest = Manifest.from_json(path.read_bytes())
    assert (manifest.records, manifest.rejected) == (len(files), ())


def test_text_saved_as_jpg_on_remote_storage_is_rejected_in_the_same_words(tmp_path):
    import fsspec

    fs = fsspec.filesystem("memory")
    for rel, data in {**GOOD, "b/notes.jpg": TEXT}.items():
        fs.pipe_file(f"/raw/{rel}", data)
    write_listing(list_files("memory://raw"), str(tmp_path / "listing"))
    result = CliRunner().invoke(
        app,
        [
            *("write", str(tmp_path / "listing"), "--out", "memory://out"),
            *("--manifest", str(tmp_path / "m.json"), "--no-progress", "--on-error", "skip"),
        ],
    )
    assert result.exit_code == 0, result.stderr
    manifest = Manifest.from_json((tmp_path / "m.json").read_bytes())
    assert [(r.path, r.reason) for r in manifest.rejected] == [("b/notes.jpg", NOT_AN_IMAGE)]


def test_a_transform_does_not_bypass_the_check(tmp_path, monkeypatch):
    (tmp_path / "tx_img.py").write_text("def f(path, data, label):\n    return {'n': len(data)}\n")
    monkeypatch.chdir(tmp_path)
    code, stderr, _ = _write(tmp_path, {**GOOD, "b/notes.jpg": TEXT}, "--transform", "tx_img:f")
    assert code == 1
    assert stderr == f"error: {tmp_path / 'raw'}/b/notes.jpg: {NOT_AN_IMAGE}{SKIP}\n"


# ----------------------------------------------------------------------------- validate


def _record(payload: bytes, path: str) -> bytes:
    features = {
        "image": ("bytes", [payload]),
        "label": ("int64", [0]),
        "path": ("bytes", [path.encode()]),
        "sha256": ("bytes", [hashlib.sha256(payload).hexdigest().encode()]),
    }
    return b"".join(tfrecord.frame([encode_bytes(features)]))  # type: ignore[arg-type]


def test_validate_reports_a_text_payload_under_an_image_name(tmp_path, loop):
    """A shard from elsewhere (or an older writer) holding text as a .jpg fails validation."""
    code, stderr, manifest_path = _write(tmp_path, GOOD, "--num-shards", "1")
    assert code == 0, stderr
    manifest = Manifest.from_json(manifest_path.read_bytes())
    shard = Path(manifest.shard_url(manifest.shards[0]))
    offset = shard.stat().st_size
    with shard.open("ab") as f:
        f.write(_record(TEXT, "b/notes.jpg"))
    doc = json.loads(manifest_path.read_text())
    doc["shards"][0].update(
        records=4, bytes=shard.stat().st_size, sha256=hashlib.sha256(shard.read_bytes()).hexdigest()
    )
    doc["totals"]["listed"] += 1
    manifest_path.write_text(json.dumps(doc))
    metrics = str(tmp_path / "metrics.json")
    result = CliRunner().invoke(
        app, ["validate", str(manifest_path), "--metrics", metrics, "--no-progress"]
    )
    assert result.exit_code == 1
    assert (
        f"{shard.name}: record 3 at byte {offset}: feature 'image' of b/notes.jpg: {NOT_AN_IMAGE}"
        in result.stderr.splitlines()
    )
    assert "Traceback" not in result.stderr


def test_c_and_python_record_loops_find_the_same_image_problems(monkeypatch):
    payloads = [(FORMATS[f], f"{f}.jpg") for f in sorted(FORMATS)]
    payloads += [(TEXT, "t.jpg"), (TEXT, "t.txt"), (b"GIF8", "g.gif"), (FORMATS["PNG"], "p.png")]
    buf = b"".join(_record(p, path) for p, path in payloads)
    schema = [FeatureSpec(n, "int64" if n == "label" else "bytes") for n in ("image", "label")]
    schema += [FeatureSpec("path", "bytes"), FeatureSpec("sha256", "bytes")]
    found = []
    for c in (native.NATIVE, None):
        monkeypatch.setattr(native, "NATIVE", c)
        problems: list[tuple[str, int, int]] = []
        checker = recordcheck.RecordChecker(
            schema,
            "image",
            num_labels=1,
            check_sha=True,
            decode_images=False,
            labels=[0],
            add=lambda what, i, at, problems=problems: problems.append((what, i, at)),
        )
        assert recordcheck.check_records(buf, checker) == len(payloads)
        found.append(problems)
    assert found[0] == found[1]
    assert [(i, what.split(":")[0]) for what, i, _ in found[0]] == [
        (5, "feature 'image' of t.jpg"),
        (7, "feature 'image' of g.gif"),
    ]
