"""Image statistics from the write pass: as Pillow counts, the same resumed or grown, bounded."""

from __future__ import annotations

import io
import json
import random
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from tfshards.listing.listing import list_files
from tfshards.shardset.histogram import Histogram, bin_bounds, bin_of
from tfshards.shardset.imagestats import BYTE_BITS, DIM_BITS, ImageStats, VersionStats, merged
from tfshards.shardset.layout import IMAGESTATS_NAME
from tfshards.shardset.manifest import Manifest
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import WriteResult, write

CHANNELS = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4, "CMYK": 4, "P": 3}


def make_mixed(root: Path, count: int, seed: int = 0, prefix: str = "f") -> Path:
    """JPEGs and PNGs of many sizes; every seventh grey."""
    rng = random.Random(seed)
    for i in range(count):
        mode = "L" if i % 7 == 0 else "RGB"
        fmt = "jpg" if i % 2 else "png"
        folder = root / f"c{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        size = (rng.randint(8, 300), rng.randint(8, 120))
        Image.new(mode, size, color=rng.randint(0, 255)).save(folder / f"{prefix}{i:04d}.{fmt}")
    return root


def _write(raw: Path, out: Path, **kw) -> WriteResult:
    config = WriteConfig(out=str(out), executor="serial", num_shards=4, **kw)
    return write(config, list_files(str(raw)), progress=False)


def _version(m: Manifest) -> VersionStats:
    path = Path(m.directory) / IMAGESTATS_NAME
    return VersionStats.from_json(path.read_bytes(), str(path))


def _pillow(raw: Path) -> ImageStats:
    """The same statistics, counted by opening every file with Pillow."""
    out = ImageStats()
    for p in sorted(raw.rglob("*.*")):
        with Image.open(p) as im:
            w, h = im.size
            fmt, ch = im.format or "", CHANNELS[im.mode]
        out.add(fmt, w, h, ch, p.stat().st_size, str(p.relative_to(raw)))
    return out


def test_stats_match_a_pillow_count(tmp_path: Path, loop: str) -> None:
    raw = make_mixed(tmp_path / "raw", 70)
    stats = _version(_write(raw, tmp_path / "out").manifest)
    written = merged(stats.buckets.values())
    want = _pillow(raw)
    assert written.to_json() == want.to_json()
    assert written.images == 70
    assert written.formats == {"JPEG": 35, "PNG": 35}
    assert written.channels == {"1": 10, "3": 60}
    widths = sorted(Image.open(p).size[0] for p in raw.rglob("*.*"))
    low, high = bin_bounds(bin_of(widths[(len(widths) - 1) // 2], len(written.width.counts)))
    assert low <= written.width.median() < high
    assert (written.width.low, written.width.high) == (widths[0], widths[-1])


def test_a_header_cut_short_says_so() -> None:
    from tfshards.format.imageheader import UNKNOWN, read_header

    buf = io.BytesIO()
    Image.new("RGB", (40, 30)).save(buf, "JPEG")
    assert read_header(buf.getvalue()[:40]) == ("JPEG", 0, 0, 0)
    assert read_header(b"hello world, no image") == (UNKNOWN, 0, 0, 0)
    stats = ImageStats()
    stats.add("JPEG", 0, 0, 0, 40, "cut.jpg")
    assert (stats.unknown_size, stats.channels, stats.width.total) == (1, {"unknown": 1}, 0)


@pytest.mark.parametrize(
    ("fmt", "mode", "channels"),
    [("GIF", "RGB", 3), ("BMP", "RGB", 3), ("BMP", "RGBA", 4), ("WEBP", "RGB", 3),
     ("WEBP", "RGBA", 4), ("PNG", "LA", 2), ("PNG", "P", 3), ("JPEG", "CMYK", 4)],
)  # fmt: skip
def test_other_formats_match_pillow(fmt: str, mode: str, channels: int) -> None:
    from tfshards.format.imageheader import read_header

    buf = io.BytesIO()
    Image.new(mode, (37, 21)).save(buf, fmt)
    found = read_header(buf.getvalue())
    assert (found.format.upper(), found.width, found.height) == (fmt, 37, 21)
    assert found.channels == channels


def test_resumed_write_has_the_same_stats(tmp_path: Path) -> None:
    raw = make_mixed(tmp_path / "raw", 40)
    m = _write(raw, tmp_path / "out").manifest
    first = (Path(m.directory) / IMAGESTATS_NAME).read_bytes()
    version = Path(m.directory)
    (version / "manifest.json").unlink()  # killed before the commit: shards and sidecars stay
    (version / IMAGESTATS_NAME).unlink()
    shutil.rmtree(version / "imagestats")
    again = _write(raw, tmp_path / "out")
    assert again.manifest.fingerprint == m.fingerprint
    assert again.reused == len(m.shards)
    assert (version / IMAGESTATS_NAME).read_bytes() == first


def test_a_version_written_after_an_unrelated_one_has_the_same_stats_file(
    tmp_path: Path,
) -> None:
    """The statistics compare with the version grown from, never with whatever manifest was
    last: seed 0, seed 7 (not grown from it), seed 0 again gave one version name two
    imagestats.json, the second naming seed 7's version as its base."""
    raw = make_mixed(tmp_path / "raw", 30)
    copy = str(tmp_path / "manifest.json")
    first = _write(raw, tmp_path / "out", manifest_copy=copy, seed=0).manifest
    stats = Path(first.directory) / IMAGESTATS_NAME
    before = stats.read_bytes()
    other = _write(raw, tmp_path / "out", manifest_copy=copy, seed=7).manifest
    assert other.fingerprint != first.fingerprint and other.base == ""
    assert _version(other).base is None
    again = _write(raw, tmp_path / "out", manifest_copy=copy, seed=0).manifest
    assert again.fingerprint == first.fingerprint
    assert stats.read_bytes() == before


@pytest.mark.parametrize(
    ("base_companions", "changed"),
    [(True, False), (False, False), (True, True)],
    ids=["carried", "counted", "one-bucket-rewritten"],
)
def test_grown_write_has_the_stats_of_a_fresh_one(
    tmp_path: Path, base_companions: bool, changed: bool
) -> None:
    """Buckets kept whole carry the base's totals, a rewritten one is counted again: as fresh."""
    raw = make_mixed(tmp_path / "raw", 60)
    copy = tmp_path / "manifest.json"
    old = _write(raw, tmp_path / "out", manifest_copy=str(copy)).manifest
    if not base_companions:  # a base written before statistics: counted from its records
        shutil.rmtree(Path(old.directory) / "imagestats")
        (Path(old.directory) / IMAGESTATS_NAME).unlink()
    make_mixed(raw, 12, seed=5, prefix="new")
    if changed:  # another size under the same name: the shard holding it is written again
        (raw / "c0" / "f0000.png").unlink()
        Image.new("L", (301, 77), color=9).save(raw / "c0" / "f0000.png")
    result = _write(raw, tmp_path / "out", manifest_copy=str(copy))
    grown = result.manifest
    assert grown.base == old.fingerprint
    assert result.reused == len(old.shards) - changed
    fresh = _write(raw, tmp_path / "fresh", previous=None).manifest
    assert fresh.base == ""
    got, want = _version(grown), _version(fresh)
    assert {b: s.to_json() for b, s in got.buckets.items()} == {
        b: s.to_json() for b, s in want.buckets.items()
    }
    assert merged(got.buckets.values()).images == 72
    if base_companions:
        assert got.base_fingerprint == old.fingerprint
        assert merged((got.base or {}).values()).images == 60
    else:
        assert got.base is None


def _cycled(count: int) -> ImageStats:
    """``count`` images cycling through ten fixed headers."""
    shapes = [("JPEG", 640, 480, 3), ("PNG", 32, 32, 1), ("PNG", 1024, 768, 4), ("GIF", 7, 9, 3)]
    stats = ImageStats()
    for i in range(count):
        fmt, w, h, ch = shapes[i % len(shapes)]
        stats.add(fmt, w + i % 10, h, ch, 1000 + 37 * (i % 10), f"img{i:06d}.x")
    return stats


def test_size_does_not_grow_with_records() -> None:
    small, large = _cycled(1_000), _cycled(10_000)
    a, b = json.dumps(small.to_json()), json.dumps(large.to_json())
    # Only the counts' digits differ: every number written as 0, the two are the same length.
    assert len(re.sub(r"\d+", "0", a)) == len(re.sub(r"\d+", "0", b))
    rng = random.Random(1)
    wild = ImageStats()
    for i in range(10_000):  # any values: still the fixed bins, at most 3 paths a key
        w, h = rng.randint(1, 1 << 20), rng.randint(1, 1 << 20)
        wild.add(rng.choice("ABCD"), w, h, rng.randint(1, 4), rng.randint(1, 1 << 40), f"{i}")
    assert len(wild.width.counts) == len(Histogram.empty(DIM_BITS).counts)
    assert len(wild.nbytes.counts) == len(Histogram.empty(BYTE_BITS).counts)
    assert all(len(v) <= 3 for v in wild.format_examples.values())
    assert len(json.dumps(wild.to_json())) < 20_000


def test_merge_is_order_free() -> None:
    parts = [_cycled(n) for n in (3, 50, 7)]
    one = merged(parts).to_json()
    assert merged(reversed(parts)).to_json() == one
    assert Counter(merged(parts).formats) == sum((Counter(p.formats) for p in parts), Counter())


def _encoded(image: Image.Image, fmt: str, **options: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **options)
    return buf.getvalue()


_GREY = Image.new("L", (5, 6), 40)
_CHANNEL_CASES = {
    "8-bit grey BMP": _encoded(_GREY, "BMP"),
    "8-bit palette BMP": _encoded(_GREY.convert("P"), "BMP"),
    "24-bit BMP": _encoded(_GREY.convert("RGB"), "BMP"),
    "palette PNG": _encoded(_GREY.convert("P"), "PNG"),
    "palette PNG with tRNS": _encoded(_GREY.convert("P"), "PNG", transparency=0),
    "RGB PNG with tRNS": _encoded(_GREY.convert("RGB"), "PNG", transparency=(0, 0, 0)),
    "grey PNG with tRNS": _encoded(_GREY, "PNG", transparency=0),
}


@pytest.mark.parametrize("kind", sorted(_CHANNEL_CASES))
def test_channels_are_those_tensorflow_decodes(kind: str) -> None:
    """An 8-bit BMP decodes grey (its palette ignored) and a palette PNG with a tRNS chunk
    RGBA: the statistics counted both as RGB, so non_rgb_share missed them."""
    import tensorflow as tf

    from tfshards.format.imageheader import read_header

    data = _CHANNEL_CASES[kind]
    decoded = tf.io.decode_image(data, expand_animations=False)
    assert read_header(data).channels == decoded.shape[-1]


def test_the_c_loop_reads_headers_as_the_reference_does() -> None:
    import numpy as np

    from tfshards.format import native
    from tfshards.format.imageheader import NATIVE_FORMATS, read_header

    if native.NATIVE is None:
        pytest.skip("tfshards.format._native is not built")
    samples = []
    for fmt, mode in [("JPEG", "L"), ("JPEG", "CMYK"), ("PNG", "LA"), ("GIF", "P"),
                      ("BMP", "RGBA"), ("WEBP", "RGB"), ("WEBP", "RGBA")]:  # fmt: skip
        buf = io.BytesIO()
        Image.new(mode, (300, 7)).save(buf, fmt)
        whole = buf.getvalue()
        samples += [whole[:n] for n in range(0, 64)] + [whole]
    samples += [b"RIFF\0\0\0\0WEBPVP8X" + bytes(20), b"BM" + bytes(40), b"\xff\xd8\xff\xda"]
    samples += list(_CHANNEL_CASES.values())
    joined = b"".join(samples)
    ends = np.cumsum([len(s) for s in samples]).astype(np.int64)
    starts = ends - np.array([len(s) for s in samples], dtype=np.int64)
    heads = np.frombuffer(native.NATIVE.image_headers(joined, starts, ends), dtype=np.int64)
    for sample, (code, w, h, ch) in zip(samples, heads.reshape(-1, 4).tolist(), strict=True):
        assert read_header(sample) == (NATIVE_FORMATS[code], w, h, ch), sample[:32]


def test_bins_of_a_batch_are_those_of_each_value() -> None:
    import numpy as np

    from tfshards.shardset.histogram import bin_count, bins_of

    values = [0, 1, 31, 32, 33, 63, 64, 65, 1000, 65535, 65536, 1 << 30, (1 << 36) + 5]
    values += random.Random(2).sample(range(1 << 20), 200)
    for bits in (DIM_BITS, BYTE_BITS):
        bins = bin_count(bits)
        found = bins_of(np.array(values, dtype=np.int64), bins).tolist()
        assert found == [bin_of(v, bins) for v in values]
        assert all(bin_bounds(b)[0] <= v for b, v in zip(found, values, strict=True))
