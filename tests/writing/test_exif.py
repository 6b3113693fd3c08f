"""write.exif: the EXIF orientation read from headers, applied (upright), counted, ignored."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from tfshards.errors import ConfigError
from tfshards.format import exif, native, tfrecord
from tfshards.format.example import encode_bytes
from tfshards.format.exampleparser import decode
from tfshards.format.tfrecord import frame
from tfshards.listing.listing import list_files
from tfshards.shardset.manifest import Manifest
from tfshards.validation import imagegates
from tfshards.validation.validate import ValidateConfig, ValidationReport, validate
from tfshards.writing.config import WriteConfig
from tfshards.writing.orientation import upright
from tfshards.writing.writer import write

SIDE = 48
# What undoes each orientation's transpose (Pillow's exif_transpose applies the tag's own).
_STORED = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


def _upright() -> Image.Image:
    """No symmetry: a red block top left, a green bar along the top, blue bottom right."""
    pixels = np.full((SIDE, SIDE, 3), 40, np.uint8)
    pixels[:16, :16] = (230, 30, 30)
    pixels[:6, 20:] = (30, 220, 30)
    pixels[32:, 36:] = (30, 30, 230)
    return Image.fromarray(pixels)


def _tagged(turn: int, fmt: str) -> bytes:
    """The upright image stored so that applying orientation ``turn`` gives it back."""
    image = _upright()
    if turn in _STORED:
        image = image.transpose(_STORED[turn])
    tags = Image.Exif()
    tags[exif.TAG] = turn
    out = io.BytesIO()
    if fmt == "JPEG":
        image.save(out, "JPEG", quality=95, exif=tags.tobytes())
    elif fmt == "WEBP":
        image.save(out, "WEBP", lossless=True, exif=tags.tobytes())
    else:
        image.save(out, "PNG", exif=tags.tobytes())
    return out.getvalue()


def _pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"), dtype=np.int16)


@pytest.fixture
def tagged_tree(tmp_path: Path) -> Path:
    """Eight JPEGs (orientations 1..8), two PNGs (eXIf 1 and 6) and an untagged JPEG."""
    root = tmp_path / "raw"
    (root / "a").mkdir(parents=True)
    for turn in range(1, 9):
        (root / "a" / f"o{turn}.jpg").write_bytes(_tagged(turn, "JPEG"))
    for turn in (1, 6):
        (root / "a" / f"p{turn}.png").write_bytes(_tagged(turn, "PNG"))
    plain = io.BytesIO()
    _upright().save(plain, "JPEG", quality=90)
    (root / "a" / "plain.jpg").write_bytes(plain.getvalue())
    return root


def _write(root: Path, out: Path, **kw: object) -> tuple[Manifest, int]:
    result = write(
        WriteConfig(out=str(out), num_shards=2, **kw), list_files(str(root)), progress=False
    )
    return result.manifest, result.rotated


def _stored(m: Manifest) -> dict[str, dict[str, bytes]]:
    """Each record's image and sha256 by path."""
    out = {}
    for shard in m.shards:
        data = tfrecord.decompress(Path(m.root, shard.name).read_bytes(), m.compression)
        for scanned in tfrecord.scan(data):
            features = decode(scanned.data)
            path = bytes(features["path"][1][0]).decode()
            out[path] = {
                "image": bytes(features["image"][1][0]),
                "sha256": bytes(features["sha256"][1][0]),
            }
    return out


# ----------------------------------------------------------------------------- headers


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])  # a WebP's was never read
@pytest.mark.parametrize("turn", range(1, 9))
def test_the_header_reader_finds_what_pillow_finds(turn, fmt):
    data = _tagged(turn, fmt)
    with Image.open(io.BytesIO(data)) as image:
        assert image.getexif().get(exif.TAG) == turn
    assert exif.orientation(data) == turn
    if native.NATIVE is not None:  # the write pass's C reader (image_records) too
        record = encode_bytes({"image": ("bytes", [data]), "path": ("bytes", [b"a/x"])})
        rows, _ = native.NATIVE.image_records(b"".join(frame([record])), b"image", b"path")
        assert np.frombuffer(rows, dtype=np.int64)[8] == turn


def test_no_tag_no_exif_and_garbage_read_as_upright():
    plain = io.BytesIO()
    _upright().save(plain, "JPEG")
    assert exif.orientation(plain.getvalue()) == 1
    assert exif.orientation(b"\xff\xd8\xff\xe1\x00\x08Exif\x00\x00") == 1  # cut short
    assert exif.orientation(b"not an image") == 1
    assert exif.tiff_orientation(b"MM\x00*\x00\x00\x00\x08\x00\x01\x01\x12\x00\x03") == 1


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
@pytest.mark.parametrize("turn", range(2, 9))
def test_upright_turns_the_pixels_as_pillows_exif_transpose(turn, fmt):
    data = _tagged(turn, fmt)
    with Image.open(io.BytesIO(data)) as image:
        expected = np.asarray(ImageOps.exif_transpose(image).convert("RGB"), dtype=np.int16)
    found = _pixels(upright(data, turn))
    assert found.shape == expected.shape
    tolerance = 6 if fmt == "JPEG" else 0  # one more JPEG generation, same tables
    assert np.abs(found - expected).mean() <= tolerance


def test_a_jpeg_is_reencoded_with_its_own_quantization_tables():
    data = _tagged(6, "JPEG")
    with Image.open(io.BytesIO(upright(data, 6))) as turned, Image.open(io.BytesIO(data)) as src:
        assert turned.format == "JPEG" and turned.quantization == src.quantization
        assert exif.TAG not in turned.getexif()


# ----------------------------------------------------------------------------- the writer


def test_ignore_stores_every_file_byte_for_byte_under_todays_version_name(tagged_tree, tmp_path):
    m, rotated = _write(tagged_tree, tmp_path / "ignore", exif="ignore")
    default, _ = _write(tagged_tree, tmp_path / "default")
    assert m.fingerprint == default.fingerprint and "exif" not in m.params
    assert rotated == 0
    for path, record in _stored(m).items():
        assert record["image"] == (tagged_tree / path).read_bytes()


def test_apply_stores_all_eight_orientations_upright(tagged_tree, tmp_path):
    m, rotated = _write(tagged_tree, tmp_path / "apply", exif="apply")
    assert m.params["exif"]["mode"] == "apply" and rotated == 8  # o2..o8 and p6
    reference = np.asarray(_upright(), dtype=np.int16)
    stored = _stored(m)
    for path, record in stored.items():
        source = (tagged_tree / path).read_bytes()
        image = record["image"]
        assert record["sha256"] == hashlib.sha256(image).hexdigest().encode()
        assert exif.orientation(image) == 1
        if exif.orientation(source) == 1:
            assert image == source  # orientation 1 or none: byte for byte
        else:
            assert image[:4] == source[:4]  # a JPEG stays a JPEG, a PNG a PNG
        tolerance = 0 if path.endswith(".png") else 8
        assert np.abs(_pixels(image) - reference).mean() <= tolerance, path


def test_warn_stores_todays_bytes_counts_the_tagged_files_and_names_a_new_version(
    tagged_tree, tmp_path
):
    ignored, _ = _write(tagged_tree, tmp_path / "ignore")
    warned, rotated = _write(tagged_tree, tmp_path / "warn", exif="warn")
    assert rotated == 8 and warned.params["exif"] == "warn"
    assert warned.fingerprint != ignored.fingerprint
    assert [s.sha256 for s in warned.shards] == [s.sha256 for s in ignored.shards]


def test_validate_counts_rotated_records_per_side(tagged_tree, tmp_path):
    def rotated(m: Manifest) -> dict[str, int]:
        manifest = str(Path(m.root, "manifest.json"))
        report = validate(ValidateConfig(manifest=manifest, val_fraction=0.5))
        assert report.ok
        return _rotated(report)

    ignored = rotated(_write(tagged_tree, tmp_path / "ignore", buckets=2)[0])
    assert sum(ignored.values()) == 8 and set(ignored) == {"train", "val"}
    assert rotated(_write(tagged_tree, tmp_path / "apply", exif="apply", buckets=2)[0]) == {
        "train": 0,
        "val": 0,
    }


def test_the_loader_decodes_an_applied_record_upright(tagged_tree, tmp_path):
    """TensorFlow's decoders ignore EXIF: the stored pixels are what the model sees."""
    from tfshards.reading import loader

    jpegs = tmp_path / "jpegs"
    (jpegs / "a").mkdir(parents=True)
    for path in sorted((tagged_tree / "a").glob("o*.jpg")):
        (jpegs / "a" / path.name).write_bytes(path.read_bytes())
    m, _ = _write(jpegs, tmp_path / "apply", exif="apply")
    data = loader.make_dataset(
        m.shards, m, batch_size=8, training=False, image_size=(SIDE, SIDE), image_dtype="uint8"
    )
    images, _ = next(iter(data))
    reference = np.asarray(_upright(), dtype=np.int16)
    assert images.shape[0] == 8
    for image in images.numpy().astype(np.int16):
        assert np.abs(image - reference).mean() <= 8


def test_an_unknown_mode_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="exif"):
        WriteConfig(out=str(tmp_path), exif="rotate")


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
def test_validate_counts_rotated_records_in_compressed_shards(tagged_tree, tmp_path, compression):
    m, _ = _write(tagged_tree, tmp_path / compression, compression=compression)
    report = validate(ValidateConfig(manifest=str(Path(m.root, "manifest.json"))))
    assert report.ok and _rotated(report) == {"train": 8, "val": 0}


def _rotated(report: ValidationReport) -> dict[str, int]:
    """Rotated records per side, as validate's image metrics (results/validate/images.json)."""
    assert report.images is not None
    return {side: m["exif_rotated"] for side, m in imagegates.metrics(report.images).items()}


@pytest.mark.skipif(native.NATIVE is None, reason="the compiled loops are not built")
def test_the_write_pass_reads_orientation_in_c_as_the_python_reference_does(tagged_tree):
    """The writer counts rotated images from each flushed buffer in C (image_records)."""
    images = [p.read_bytes() for p in sorted((tagged_tree / "a").iterdir())]
    cut = [data[:n] for data in images for n in (3, 20, 40, 60, 100, 300)]
    for data in images + cut:
        record = encode_bytes({"image": ("bytes", [data]), "path": ("bytes", [b"a/x"])})
        buffer = b"".join(bytes(p) for p in frame([record]))
        rows, _ = native.NATIVE.image_records(buffer, b"image", b"path")
        assert np.frombuffer(rows, dtype=np.int64)[8] == exif.orientation(data)
