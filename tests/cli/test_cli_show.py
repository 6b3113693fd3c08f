"""``tfshards show``: one record by path or place, its image, a contact sheet; one-line errors."""

from __future__ import annotations

import io
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image, ImageOps
from typer.testing import CliRunner

from tfshards.cli import app
from tfshards.errors import InputError
from tfshards.reading.lookup import Version
from tfshards.shardset.layout import MANIFEST_NAME
from tfshards.shardset.manifest import Manifest

runner = CliRunner()
RawMaker = Callable[..., Path]
SetWriter = Callable[..., Manifest]


@pytest.fixture(params=["none", "gzip"])
def version(
    request: pytest.FixtureRequest, shared_raw: RawMaker, write_set: SetWriter, tmp_path: Path
) -> Manifest:
    raw = shared_raw(40, 24, classes=4)
    return write_set(raw, tmp_path / "shards", num_shards=8, compression=request.param)


def manifest_path(m: Manifest) -> str:
    return os.path.join(m.directory, MANIFEST_NAME)


def test_a_record_by_path_is_the_file_listed_there(version: Manifest, shared_raw: RawMaker) -> None:
    raw = shared_raw(40, 24, classes=4)
    path = sorted(p.relative_to(raw).as_posix() for p in raw.rglob("*.jpg"))[17]
    found = Version(version).find(path)
    assert found.path == path and found.label == path.split("/")[0]
    assert bytes(found.features["image"][1][0]) == (raw / path).read_bytes()
    shard = next(s for s in version.shards if s.name == found.shard)
    assert Version(version).find(f"{shard.name}:{found.index}") == found
    number = [s.name for s in version.shards].index(found.shard)
    assert Version(version).find(f"{number}:{found.index}") == found


def test_show_prints_the_record_and_writes_its_png(version: Manifest, tmp_path: Path) -> None:
    png = tmp_path / "one.png"
    result = runner.invoke(app, ["show", manifest_path(version), "0:0", "--png", str(png)])
    assert result.exit_code == 0, result.output
    first, *features = result.output.splitlines()[:-1]
    assert first.startswith(f"{version.shards[0].name}:0  ")
    assert any(line.startswith("  image (bytes): <") for line in features)
    assert any(line.startswith("  label (int64): ") for line in features)
    said = "  image: JPEG 24 x 24, 3 channels by its header, EXIF orientation 1"
    assert features[-1] == said  # what the header says: what a statistic counted
    assert Image.open(png).format == "PNG" and Image.open(png).size == (24, 24)


def test_show_replaces_only_a_png_it_wrote(
    version: Manifest, shared_raw: RawMaker, tmp_path: Path
) -> None:
    """--png raw/00/x.jpg turned the raw JPEG into a PNG in place (exit 0): a file show did
    not write is refused, and its own PNG (or sheet) is replaced whole."""
    theirs = tmp_path / "raw" / "00" / "a.jpg"  # a copy: the shared tree stays as it is
    theirs.parent.mkdir(parents=True)
    theirs.write_bytes(next(shared_raw(40, 24, classes=4).rglob("*.jpg")).read_bytes())
    before = theirs.read_bytes()
    for option in ("--png", "--sheet"):
        args = ["show", manifest_path(version), *(["0:0"] if option == "--png" else [])]
        result = runner.invoke(app, [*args, option, str(theirs)])
        assert result.exit_code == 1 and theirs.read_bytes() == before, result.output
        assert result.stderr.strip() == (
            f"error: {theirs}: expected a new file or a PNG that show wrote, found a file "
            f"show did not write: pass another {option} or remove it"
        )
        ours = tmp_path / f"ours{option}.png"
        for _ in range(2):  # written, then replaced
            assert runner.invoke(app, [*args, option, str(ours)]).exit_code == 0
        assert Image.open(ours).format == "PNG"
    inside = os.path.join(version.directory, "x.png")  # validate then failed the version
    result = runner.invoke(app, ["show", manifest_path(version), "--sheet", inside])
    assert result.exit_code == 1 and not os.path.exists(inside), result.output
    assert "expected a path outside every shard version folder" in result.stderr
    folder = tmp_path / "folder.png"
    folder.mkdir()
    result = runner.invoke(app, ["show", manifest_path(version), "0:0", "--png", str(folder)])
    assert result.exit_code == 1 and "found a folder: pass another --png" in result.stderr


def test_its_own_png_is_known_behind_a_large_icc_profile(
    write_set: SetWriter, tmp_path: Path
) -> None:
    """Pillow writes the source's ICC profile before the mark: a rerun over a PNG of an image
    with a 20 KB profile was refused as a file show did not write."""
    raw = tmp_path / "raw" / "a"
    raw.mkdir(parents=True)
    profile = random.Random(0).randbytes(20_000)  # stored as given, zlib cannot shrink it
    Image.new("RGB", (8, 8), (200, 0, 0)).save(raw / "p.jpg", icc_profile=profile)
    path = manifest_path(write_set(tmp_path / "raw", tmp_path / "shards", num_shards=1))
    png = tmp_path / "p.png"
    for _ in range(2):
        result = runner.invoke(app, ["show", path, "a/p.jpg", "--png", str(png)])
        assert result.exit_code == 0, result.output
    assert png.read_bytes().index(b"tEXtSoftware") > 4096


def test_a_sheet_of_one_label_on_one_side(version: Manifest, tmp_path: Path) -> None:
    sheet = tmp_path / "sheet.png"
    args = ["show", manifest_path(version), "--sheet", str(sheet), "--label", "01"]
    result = runner.invoke(app, [*args, "--count", "4", "--columns", "3", "--side", "train"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"4 images -> {sheet}"
    grid = Image.open(io.BytesIO(sheet.read_bytes())).convert("RGB")
    assert grid.size == (3 * 96, 2 * 96)
    # A 24 px image is grown by a whole factor (3: 72 px), not left a dot in its 96 px cell.
    cell = ImageOps.invert(grid.crop((0, 0, 96, 96)))  # white background -> black: no box
    left, top, right, bottom = cell.getbbox() or (0, 0, 0, 0)
    assert (right - left, bottom - top) == (72, 72)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["nope/0.jpg"], "nope/0.jpg: no record of version"),
        (["99:0"], "99:0: expected a shard name of version"),
        (["0:999"], "0:999: expected a record index below"),
        (["--sheet", "x.png", "--label", "zebra"], "label 'zebra': expected one of"),
        (["--sheet", "x.png", "--side", "both"], "expected one of all, train, val"),
        (["--sheet", "x.png", "--val-fraction", "1.5"], "expected a share in [0, 1), got 1.5"),
        (["--sheet", "x.png", "--val-fraction", "-0.2"], "expected a share in [0, 1), got -0.2"),
        (["--sheet", "x.png", "--side", "val", "--val-fraction", "0"], "the val side holds no"),
        ([], "give a RECORD, or --sheet FILE"),
        (["0:0", "--sheet", "x.png"], "give them without RECORD"),
        (["0:0", "--label", "a"], "give them without RECORD"),
        (["--sheet", "x.png", "--png", "y.png"], "--png writes one record's image"),
    ],
)
def test_a_bad_request_is_one_line(version: Manifest, args: list[str], said: str) -> None:
    result = runner.invoke(app, ["show", manifest_path(version), *args])
    assert result.exit_code in (1, 2) and said in result.output, result.output
    assert "Traceback" not in result.output


def _encoded(image: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt)
    return out.getvalue()


def test_modes_png_lacks_are_shown_as_tensorflow_decodes_them(
    write_set: SetWriter, tmp_path: Path
) -> None:
    """A CMYK JPEG's PNG is RGB (Pillow writes no CMYK PNG: it was a traceback), a 16-bit
    grey PNG keeps its 16 bits, and on a sheet shows its high byte (it was drawn white)."""
    import numpy as np

    raw = tmp_path / "raw" / "a"
    raw.mkdir(parents=True)
    (raw / "cmyk.jpg").write_bytes(_encoded(Image.new("CMYK", (6, 6), (0, 255, 255, 0)), "JPEG"))
    grey = Image.fromarray(np.full((9, 9), 40_000, np.uint16))
    (raw / "g16.png").write_bytes(_encoded(grey, "PNG"))
    path = manifest_path(write_set(tmp_path / "raw", tmp_path / "shards", num_shards=1))
    for name, mode in (("cmyk.jpg", "RGB"), ("g16.png", "I;16")):
        png = tmp_path / f"{name}.png"
        result = runner.invoke(app, ["show", path, f"a/{name}", "--png", str(png)])
        assert result.exit_code == 0, result.output
        assert Image.open(png).mode == mode
    sheet = tmp_path / "sheet.png"
    result = runner.invoke(app, ["show", path, "--sheet", str(sheet), "--columns", "2"])
    assert result.exit_code == 0, result.output
    grid = Image.open(sheet).convert("RGB")
    assert grid.getpixel((96 + 48, 48)) == (40_000 >> 8,) * 3  # g16.png, second in the shard
    red, green, blue = grid.getpixel((48, 48))
    assert red > 200 and green < 60 and blue < 60


def _one_image_set(write_set: SetWriter, tmp_path: Path, name: str) -> str:
    """A version of one 4 px grey PNG at ``a/<name>``; its manifest's path."""
    raw = tmp_path / "raw" / "a"
    raw.mkdir(parents=True)
    (raw / name).write_bytes(_encoded(Image.new("L", (4, 4)), "PNG"))
    return manifest_path(write_set(tmp_path / "raw", tmp_path / "shards", num_shards=1))


def test_a_path_feature_in_any_script_is_printed_as_text(
    write_set: SetWriter, tmp_path: Path
) -> None:
    path = _one_image_set(write_set, tmp_path, "ünï cödé.png")
    result = runner.invoke(app, ["show", path, "a/ünï cödé.png"])
    assert result.exit_code == 0, result.output
    assert "  path (bytes): 'a/ünï cödé.png'" in result.output.splitlines()


def test_a_path_with_a_line_break_keeps_the_record_header_on_one_line(
    write_set: SetWriter, tmp_path: Path
) -> None:
    path = _one_image_set(write_set, tmp_path, "two\nlines.png")
    result = runner.invoke(app, ["show", path, "a/two\nlines.png"])
    assert result.exit_code == 0, result.output
    header = result.output.splitlines()[0]
    assert header.endswith("  'a/two\\nlines.png'  label a"), header


def test_bytes_that_are_no_image_are_named_by_their_first_bytes(
    write_set: SetWriter, tmp_path: Path
) -> None:
    path = _one_image_set(write_set, tmp_path, "one.png")
    args = ["show", path, "0:0", "--feature", "path", "--png", str(tmp_path / "q.png")]
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == (
        "error: a/one.png: expected an image Pillow reads, found 9 bytes starting b'a/one.pn'"
    )


def test_an_image_a_sheet_cannot_show_is_an_empty_cell_named_in_a_line(tmp_path: Path) -> None:
    """Float pixels (mode F) have no 8-bit form: the sheet is drawn all the same."""
    import numpy as np

    from tfshards.reading.sheet import contact_sheet, to_png

    floats = _encoded(Image.fromarray(np.ones((4, 4), np.float32)), "TIFF")
    grey = _encoded(Image.new("L", (4, 4), 200), "PNG")
    unshown: list[str] = []
    sheet = contact_sheet([("a/f.tif", floats), ("a/g.png", grey)], cell=20, unshown=unshown)
    assert Image.open(io.BytesIO(sheet)).size == (40, 20)
    assert unshown == [
        "a/f.tif: cannot show an image of mode F (float pixels): no TensorFlow decoder reads "
        "one, so there is no 8-bit scale to match; store it as 8- or 16-bit"
    ]
    with pytest.raises(InputError, match=r"^a/f\.tif: cannot show an image of mode F"):
        to_png(floats, "a/f.tif")


def test_an_image_over_pillows_size_guard_is_an_empty_cell_and_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pillow refuses images over twice MAX_IMAGE_PIXELS (a 14,000 x 13,000 JPEG by default,
    which TensorFlow decodes): a traceback killed the whole sheet. Here the guard is lowered."""
    from tfshards.reading.sheet import contact_sheet, to_png

    big = _encoded(Image.new("L", (30, 30), 90), "PNG")  # 900 pixels: over 2 x 100
    grey = _encoded(Image.new("L", (4, 4), 200), "PNG")
    unshown: list[str] = []
    limit = Image.MAX_IMAGE_PIXELS
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    sheet = contact_sheet([("a/big.png", big), ("a/g.png", grey)], cell=20, unshown=unshown)
    with pytest.raises(InputError, match=r"^a/big\.png: too large to show: Image size"):
        to_png(big, "a/big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", limit)
    assert Image.open(io.BytesIO(sheet)).size == (40, 20)
    said = "a/big.png: too large to show: Image size (900 pixels) exceeds limit of 200 pixels"
    assert [line.split(", could be")[0] for line in unshown] == [said]
    # Over the limit, under twice it: Pillow only warns, and decoded one 13,000 px square
    # RGBA PNG into 2 GB; refused as write --resize refuses it.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 600)
    with pytest.raises(InputError, match=r"^a/big\.png: too large to show: Image size \(900 "):
        to_png(big, "a/big.png")


def test_a_path_left_out_of_the_version_says_why(write_set: SetWriter, tmp_path: Path) -> None:
    """It said no record is listed under the path, as for a path never listed."""
    raw = tmp_path / "raw" / "a"
    raw.mkdir(parents=True)
    (raw / "one.png").write_bytes(_encoded(Image.new("L", (4, 4)), "PNG"))
    (raw / "notes.jpg").write_bytes(b"just some notes\n")
    manifest = write_set(tmp_path / "raw", tmp_path / "shards", num_shards=1, on_error="skip")
    result = runner.invoke(app, ["show", manifest_path(manifest), "a/notes.jpg"])
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == (
        f"error: a/notes.jpg: left out of version {manifest.fingerprint} when it was written: "
        "expected an image (JPEG, PNG, GIF, BMP or WebP) as its name says, found bytes "
        "b'just som'"
    )


def test_numbers_of_a_column_are_printed_as_numbers_not_numpy_reprs() -> None:
    """A float[4] column printed [np.float32(0.1), ...] beside a clean scalar."""
    import numpy as np

    from tfshards.cli.show import _value

    assert _value("float", list(np.array([0.5, 0.25], np.float32))) == "[0.5, 0.25]"
    assert _value("int64", list(np.array([3], np.int64))) == "3"
    assert _value("float", [312.0]) == "312.0"
