"""Files named as images must hold a whole image: the writer (both loops) and validate refuse
others, and JPEG or PNG files cut short."""

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
from tfshards.format.imageformat import HEAD_BYTES, cut_short, image_format
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


def _noise(fmt: str, side: int = 48, **options: object) -> bytes:
    """A real image of noise: its compressed data runs to near its end."""
    import numpy as np

    pixels = np.random.default_rng(side).integers(0, 256, (side, side, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt, **options)
    return out.getvalue()


def _with_thumbnail(jpeg: bytes) -> bytes:
    """``jpeg`` with a whole JPEG thumbnail (its own scan and end marker) in an APP1 segment."""
    thumb = b"Exif\0\0" + _noise("JPEG", 8)
    return jpeg[:2] + b"\xff\xe1" + (len(thumb) + 2).to_bytes(2, "big") + thumb + jpeg[2:]


WHOLE = {
    "baseline JPEG": _noise("JPEG"),
    "progressive JPEG": _noise("JPEG", progressive=True),
    "JPEG with a thumbnail": _with_thumbnail(_noise("JPEG")),
    "PNG": _noise("PNG"),
}


def _cut_short_by_c(data: bytes) -> bool:
    import numpy as np

    assert native.NATIVE is not None
    spans = np.array([0], dtype=np.int64), np.array([len(data)], dtype=np.int64)
    return native.NATIVE.images_refused(data, *spans) != b"\0"


@pytest.mark.parametrize("kind", sorted(WHOLE))
def test_a_jpeg_or_png_cut_anywhere_is_cut_short_and_bytes_after_its_end_are_allowed(kind):
    """Every prefix of a real image, and the image with bytes after its end, on both rules.

    TensorFlow refuses each cut one (``decode_image`` on these images missing only their
    last 2 or 12 bytes fails); the thumbnail's own end marker must not pass a cut main image.
    """
    data = WHOLE[kind]
    fmt = image_format(data[:HEAD_BYTES])
    assert fmt is not None
    cases = [(data, False), (data + b"trailing bytes\xff", False)]
    cases += [(data[:n], True) for n in range(HEAD_BYTES, len(data), 3)]
    cases += [(data[:-1], True), (data[:-2], True)]
    for case, cut in cases:
        assert cut_short(case, fmt) is cut, len(case)
        if native.NATIVE is not None:
            assert _cut_short_by_c(case) is cut, len(case)


def test_other_formats_and_malformed_jpeg_segments_are_left_to_the_decoder():
    assert not cut_short(FORMATS["GIF"][:10], "GIF")
    assert not cut_short(b"\xff\xd8\xff\xe0\x00\x04\x00\x00not a marker", "JPEG")
    assert not cut_short(b"\xff\xd8\xff\xd9", "JPEG")  # an end before any scan
    assert cut_short(b"\xff\xd8\xff\xe0\x10\x00", "JPEG")  # a segment past the end


def _animated_webp() -> bytes:
    frames = [Image.new("RGB", (16, 16), (60 * i, 0, 0)) for i in range(3)]
    out = io.BytesIO()
    frames[0].save(out, "WEBP", save_all=True, append_images=frames[1:])
    return out.getvalue()


ANIMATED = (
    "expected a still image, found an animated WebP: TensorFlow's decode_image aborts the "
    "whole process on one (TensorFlow 2.21); store it as a still WebP, a PNG or a GIF"
)


def test_a_bmp_of_fewer_than_8_bits_is_refused_by_both_loops(tmp_path, loop):
    """TensorFlow refuses one (no channels), and once aborted on one after other images:
    it is not decoded here, in a process that decodes others."""
    few, eight = io.BytesIO(), io.BytesIO()
    Image.new("1", (8, 4), 1).save(few, "BMP")
    Image.new("L", (8, 4), 90).save(eight, "BMP")
    files = {**GOOD, "b/few.bmp": few.getvalue(), "b/eight.bmp": eight.getvalue()}
    code, stderr, path = _write(tmp_path, files, "--on-error", "skip")
    assert code == 0, stderr
    manifest = Manifest.from_json(path.read_bytes())
    assert [r.path for r in manifest.rejected] == ["b/few.bmp"]
    assert manifest.rejected[0].reason.startswith("expected a BMP of 8, 24 or 32 bits a pixel")
    assert manifest.records == 4


def test_an_animated_webp_is_refused_by_both_loops_and_a_still_one_is_not(tmp_path, loop):
    """TensorFlow 2.21 aborts the process decoding one (a double free): training died naming
    nothing, and so did validate --decode's worker."""
    still = io.BytesIO()
    Image.new("RGBA", (16, 16), (0, 90, 0, 128)).save(still, "WEBP")  # VP8X, alpha only
    files = {**GOOD, "b/anim.webp": _animated_webp(), "b/still.webp": still.getvalue()}
    code, stderr, path = _write(tmp_path, files, "--on-error", "skip")
    assert code == 0, stderr
    manifest = Manifest.from_json(path.read_bytes())
    assert [(r.path, r.reason) for r in manifest.rejected] == [("b/anim.webp", ANIMATED)]
    assert manifest.records == 4


CUT_JPEG = (
    "expected a whole JPEG file (ending with its end-of-image marker FF D9), found {n:,} bytes "
    "that stop before it: the file was cut short (an interrupted copy or download?), and "
    "TensorFlow's decoder refuses it"
)
CUT_PNG = CUT_JPEG.replace("JPEG", "PNG").replace("its end-of-image marker FF D9", "its IEND chunk")


def test_a_cut_jpeg_fails_the_write_naming_the_file(tmp_path, loop):
    cut = _noise("JPEG")[:700]
    code, stderr, manifest = _write(tmp_path, {**GOOD, "b/cut.jpg": cut})
    assert code == 1
    assert stderr == f"error: {tmp_path / 'raw'}/b/cut.jpg: {CUT_JPEG.format(n=700)}{SKIP}\n"
    assert not manifest.exists()


def test_cut_files_are_rejected_with_skip_in_the_same_words_by_both_loops(tmp_path, loop):
    jpeg, png = _noise("JPEG", progressive=True), _noise("PNG")
    files = {**GOOD, "b/cut.jpg": jpeg[:-2], "b/cut.png": png[:-12], "b/whole.png": png}
    code, stderr, path = _write(tmp_path, files, "--on-error", "skip")
    assert code == 0, stderr
    manifest = Manifest.from_json(path.read_bytes())
    assert sorted((r.path, r.reason) for r in manifest.rejected) == [
        ("b/cut.jpg", CUT_JPEG.format(n=len(jpeg) - 2)),
        ("b/cut.png", CUT_PNG.format(n=len(png) - 12)),
    ]
    assert manifest.records == 4


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


@pytest.mark.parametrize(
    ("payload", "name", "said"),
    [
        (TEXT, "b/notes.jpg", NOT_AN_IMAGE),
        (_noise("PNG")[:900], "b/cut.png", CUT_PNG.format(n=900)),
    ],
    ids=["text", "cut-png"],
)
def test_validate_reports_a_payload_that_is_no_whole_image(tmp_path, loop, payload, name, said):
    """A shard from elsewhere (or an older writer) holding text as a .jpg, or an image cut
    short, fails validation."""
    code, stderr, manifest_path = _write(tmp_path, GOOD, "--num-shards", "1")
    assert code == 0, stderr
    manifest = Manifest.from_json(manifest_path.read_bytes())
    shard = Path(manifest.shard_url(manifest.shards[0]))
    offset = shard.stat().st_size
    with shard.open("ab") as f:
        f.write(_record(payload, name))
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
        f"{shard.name}: record 3 at byte {offset}: feature 'image' of {name}: {said}"
        in result.stderr.splitlines()
    )
    assert "Traceback" not in result.stderr


def test_c_and_python_record_loops_find_the_same_image_problems(monkeypatch):
    payloads = [(FORMATS[f], f"{f}.jpg") for f in sorted(FORMATS)]
    payloads += [(TEXT, "t.jpg"), (TEXT, "t.txt"), (b"GIF8", "g.gif"), (FORMATS["PNG"], "p.png")]
    payloads += [(WHOLE["PNG"][:-1], "c.png"), (WHOLE["baseline JPEG"][:-2], "c.jpg")]
    payloads += [(_animated_webp(), "a.webp")]
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
        (9, "feature 'image' of c.png"),
        (10, "feature 'image' of c.jpg"),
        (11, "feature 'image' of a.webp"),
    ]
