"""Near-duplicate images across the split: perceptual hashes, banded search, validate, cache."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from tfshards.format import phash
from tfshards.listing.listing import list_files
from tfshards.shardset import split as splits
from tfshards.shardset.manifest import Manifest
from tfshards.validation import nearduplicates, phashcache, shardcheck
from tfshards.validation.config import DEFAULT_DISTANCE
from tfshards.validation.validate import ValidateConfig, validate
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write


def synthetic(rng: np.random.Generator, side: int = 96) -> Image.Image:
    """A gradient under 3..8 random rectangles, ellipses and triangles."""
    c0, c1 = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    across = rng.random() < 0.5
    t = np.linspace(0, 1, side)[None, :, None] if across else np.linspace(0, 1, side)[:, None, None]
    image = Image.fromarray((c0 * (1 - t) + c1 * t + np.zeros((side, side, 3))).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(3, 9))):
        x0, y0 = (int(v) for v in rng.integers(0, side, 2))
        x1, y1 = x0 + int(rng.integers(8, side // 2)), y0 + int(rng.integers(8, side // 2))
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        kind = int(rng.integers(0, 3))
        if kind == 0:
            draw.rectangle([x0, y0, x1, y1], fill=colour)
        elif kind == 1:
            draw.ellipse([x0, y0, x1, y1], fill=colour)
        else:
            draw.polygon([(x0, y0), (x1, y0 + 5), (x0 + 3, y1)], fill=colour)
    return image


def jpeg(image: Image.Image, quality: int = 90) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality)
    return out.getvalue()


def variant(rng: np.random.Generator, image: Image.Image, kind: int) -> bytes:
    """A JPEG re-encode at quality 50..95, a resize by 0.5..2x, or a crop of up to 5% a side."""
    if kind == 0:
        return jpeg(image, int(rng.integers(50, 96)))
    w, h = image.size
    if kind == 1:
        scale = rng.uniform(0.5, 2.0)
        return jpeg(image.resize((int(w * scale), int(h * scale)), Image.Resampling.BILINEAR))
    dx, dy = (int(side * rng.uniform(0, 0.05)) for side in (w, h))
    left, top = int(rng.integers(0, dx + 1)), int(rng.integers(0, dy + 1))
    return jpeg(image.crop((left, top, w - (dx - left), h - (dy - top))))


def _brute(train: np.ndarray, val: np.ndarray, k: int) -> set[tuple[int, int]]:
    bits = np.bitwise_count(train[:, None] ^ val[None, :])
    return {(int(i), int(j)) for i, j in zip(*np.nonzero(bits <= k), strict=True)}


def _bits(train: np.ndarray, val: np.ndarray, pairs: set[tuple[int, int]]) -> list[tuple]:
    return [(t, v, np.bitwise_count(train[t] ^ val[v])) for t, v in pairs]


def _rows(hashes: np.ndarray) -> np.ndarray:
    rows = np.zeros(len(hashes), phash.DTYPE)
    rows["hash"], rows["ok"] = hashes, 1
    return rows


# ----------------------------------------------------------------------------- the search


@pytest.mark.parametrize("k", [0, 1, 5, 8, 15, 31])
def test_bands_are_disjoint_and_cover_the_64_bits(k):
    cut = nearduplicates.bands(k)
    assert len(cut) == k + 1 and sum(w for _, w in cut) == 64
    assert [s for s, _ in cut] == [sum(w for _, w in cut[:i]) for i in range(len(cut))]


@pytest.mark.parametrize("k", [0, 3, 8, 12])
def test_the_banded_search_finds_exactly_what_comparing_every_pair_finds(k):
    rng = np.random.default_rng(k)
    train = rng.integers(0, 2**63, 1500, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    val = rng.integers(0, 2**63, 1500, dtype=np.uint64)
    for i in range(300):  # planted pairs at 0..k+2 bits
        flips = rng.choice(64, size=i % (k + 3), replace=False)
        val[i] = train[i] ^ np.uint64(sum(1 << int(b) for b in flips))
    val[300:320] = train[0]  # one hash repeated: each pair counted once
    found = nearduplicates.find({"t": _rows(train), "v": _rows(val)}, {"v"}, k, limit=5)
    pairs = set()
    for rows in nearduplicates.candidate_pairs(train, val, k):
        pairs |= {(int(t), int(v)) for t, v, _ in rows}
    want = _brute(train, val, k)
    assert pairs == want and found.across_splits == len(want)
    assert found.hashed == 3000 and len(found.examples) == 5
    assert all(p.train[0] == "t" and p.val[0] == "v" and p.bits <= k for p in found.examples)
    # The examples are the closest pairs of all, not the first the bands met.
    closest = sorted((int(b), t, v) for t, v, b in _bits(train, val, want))[:5]
    assert [(p.bits, p.train[1], p.val[1]) for p in found.examples] == closest


def test_the_examples_are_the_closest_pairs_not_the_first_found():
    rng = np.random.default_rng(3)
    train = rng.integers(0, 2**63, 50, dtype=np.uint64)
    val = rng.integers(0, 2**63, 50, dtype=np.uint64)
    far = np.uint64((1 << 60) | (1 << 61) | (1 << 62))  # 3 bits, all in the last band
    val[:10] = train[:10] ^ far  # met first: low train indices, agreeing in the first band
    val[40] = train[40]  # the one identical pair, met last
    found = nearduplicates.find({"t": _rows(train), "v": _rows(val)}, {"v"}, 8, limit=3)
    assert found.across_splits == 11
    assert [(p.bits, p.train[1]) for p in found.examples] == [(0, 40), (3, 0), (3, 1)]


def test_records_that_did_not_decode_match_nothing():
    rows = _rows(np.zeros(4, np.uint64))
    rows["ok"][1:] = 0
    found = nearduplicates.find({"t": rows, "v": rows.copy()}, {"v"}, 8)
    assert found.across_splits == 1 and found.hashed == 2


def test_recall_and_false_positives_on_a_synthetic_set():
    """300 originals, 3 altered copies each (re-encoded, resized, cropped), 300 unrelated.

    Measured at the default 8 bits: recall 0.969 (300 of 300 re-encodes, 297 of 300
    resizes, 275 of 300 crops), 3 false pairs of 471,600 (6.4e-6; the aim was 1e-3).
    """
    rng = np.random.default_rng(0)
    originals = [synthetic(rng) for _ in range(300)]
    copies = [variant(rng, image, kind) for image in originals for kind in range(3)]
    unrelated = [jpeg(synthetic(rng)) for _ in range(300)]
    train_rows = phash.image_hashes([jpeg(image, 95) for image in originals] + unrelated[:150])
    val_rows = phash.image_hashes(copies + unrelated[150:])
    assert train_rows["ok"].all() and val_rows["ok"].all()
    found = set()
    for rows in nearduplicates.candidate_pairs(
        train_rows["hash"], val_rows["hash"], DEFAULT_DISTANCE
    ):
        found |= {(int(t), int(v)) for t, v, _ in rows}
    planted = {(i // 3, i) for i in range(len(copies))}
    recall = len(found & planted) / len(planted)
    false = len(found - planted) / (len(train_rows) * len(val_rows) - len(planted))
    by_kind = [len(found & {p for p in planted if p[1] % 3 == k}) for k in range(3)]
    print(f"recall {recall:.3f} (re-encode, resize, crop: {by_kind} of 300 each), ", end="")
    print(f"false positives {len(found - planted)} ({false:.2e} of pairs)")
    assert recall >= 0.96
    assert false <= 2e-5


# ----------------------------------------------------------------------------- validate, cache


@pytest.fixture
def near_tree(tmp_path: Path) -> Path:
    """40 originals in two label folders, each with a re-encoded copy; 20 unrelated."""
    rng = np.random.default_rng(1)
    root = tmp_path / "raw"
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
    for i in range(40):
        image = synthetic(rng)
        (root / "a" / f"orig{i:02}.jpg").write_bytes(jpeg(image, 95))
        (root / "b" / f"copy{i:02}.jpg").write_bytes(jpeg(image, 60))
    for i in range(20):
        (root / "a" / f"other{i:02}.jpg").write_bytes(jpeg(synthetic(rng)))
    return root


def _write(root: Path, out: Path, **kw: object) -> Manifest:
    config = WriteConfig(out=str(out), num_shards=8, buckets=8, **kw)  # type: ignore[arg-type]
    return write(config, list_files(str(root)), progress=False).manifest


def _recomputed(m: Manifest) -> dict[str, np.ndarray]:
    return {
        s.name: np.frombuffer(
            phash.shard_hashes(Path(m.root, s.name).read_bytes(), m.compression, "image"),
            phash.DTYPE,
        )
        for s in m.shards
    }


def _validate(m: Manifest, **kw: object):  # type: ignore[no-untyped-def]
    manifest = str(Path(m.root, "manifest.json"))
    return validate(ValidateConfig(manifest=manifest, val_fraction=0.5, **kw))  # type: ignore[arg-type]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TFSHARDS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_writing_hashes_nothing_and_validate_reports_pairs_across_the_split(
    near_tree, tmp_path, cache
):
    m = _write(near_tree, tmp_path / "out")
    assert not Path(m.root, "phash.bin").exists() and not cache.exists()
    report = _validate(m, near_duplicates=True)
    near = report.near_duplicates
    assert near is not None and report.ok
    val = {s.name for s in splits.split(m, 0.5, 0).val}
    rows = _recomputed(m)
    train = np.concatenate([rows[s.name]["hash"] for s in m.shards if s.name not in val])
    val_hashes = np.concatenate([rows[s.name]["hash"] for s in m.shards if s.name in val])
    assert near.across_splits == len(_brute(train, val_hashes, DEFAULT_DISTANCE)) > 0
    assert near.hashed == m.records
    assert report.metrics()["near_duplicates"]["across_splits"] == near.across_splits
    names = {p.paths[0].rsplit("/", 1)[-1][4:] for p in near.examples}
    assert names and all(p.paths[1].endswith(tuple(names)) for p in near.examples)
    failing = _validate(m, fail_on_near_duplicates=True)  # turns the check on by itself
    assert not failing.ok and failing.problem_count == near.across_splits
    lines = [str(p) for p in failing.problems if "near-duplicate image" in str(p)]
    assert len(lines) == near.across_splits
    assert all(".jpg)" in line and "in training and validation" in line for line in lines)


def test_the_check_is_off_by_default_and_then_hashes_nothing(near_tree, tmp_path, cache):
    m = _write(near_tree, tmp_path / "out")
    report = _validate(m)
    assert report.near_duplicates is None and "near_duplicates" not in report.metrics()
    assert not cache.exists()


def test_each_shard_is_hashed_once_then_read_from_the_cache(
    near_tree, tmp_path, cache, monkeypatch
):
    first = _write(near_tree, tmp_path / "out")
    cold = _validate(first, near_duplicates=True)
    for s in first.shards:  # the cache holds exactly the rows a hash of the shard gives
        assert phashcache.get(s.sha256, "image", s.records) == _recomputed(first)[s.name].tobytes()
    rng = np.random.default_rng(7)
    for i in range(3):
        (near_tree / "a" / f"new{i}.jpg").write_bytes(jpeg(synthetic(rng)))
    grown = _write(near_tree, tmp_path / "out", previous=str(Path(first.root, "manifest.json")))
    kept = {s.sha256 for s in first.shards}
    new = [s for s in grown.shards if s.sha256 not in kept]
    assert new and len(new) < len(grown.shards)
    hashed: list[str] = []
    real = shardcheck._Tally.hash_images

    def counted(self, window, count):  # type: ignore[no-untyped-def]
        if self.phashes is not None:  # not read from the cache
            hashed.append(self.task.name)
        return real(self, window, count)

    monkeypatch.setattr(shardcheck._Tally, "hash_images", counted)
    warm = _validate(grown, near_duplicates=True, executor="serial")
    assert sorted(set(hashed)) == sorted(s.name for s in new)  # only the new shards
    assert warm.near_duplicates is not None and cold.near_duplicates is not None
    assert warm.near_duplicates.hashed == grown.records


def test_a_damaged_cache_file_is_hashed_again(near_tree, tmp_path, cache):
    m = _write(near_tree, tmp_path / "out")
    _validate(m, near_duplicates=True)
    shard = m.shards[0]
    path = Path(phashcache.path(shard.sha256, "image"))
    data = bytearray(path.read_bytes())
    data[-2] ^= 0xFF  # a row's bits flipped: its header's sha256 no longer holds
    path.write_bytes(bytes(data))
    assert phashcache.get(shard.sha256, "image", shard.records) is None
    again = _validate(m, near_duplicates=True)
    assert again.near_duplicates is not None and again.near_duplicates.hashed == m.records
    assert phashcache.get(shard.sha256, "image", shard.records) == (
        _recomputed(m)[shard.name].tobytes()
    )


def test_a_shard_that_does_not_match_its_manifest_leaves_no_cache_entry(near_tree, tmp_path, cache):
    m = _write(near_tree, tmp_path / "out")
    shard = m.shards[0]
    path = Path(m.root, shard.name)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    report = _validate(m, near_duplicates=True)
    assert not report.ok
    assert phashcache.get(shard.sha256, "image", shard.records) is None
    assert phashcache.get(m.shards[1].sha256, "image", m.shards[1].records) is not None


def test_a_missing_or_damaged_shard_takes_no_part_whatever_the_cache_holds(
    near_tree, tmp_path, cache
):
    m = _write(near_tree, tmp_path / "out")
    whole = _validate(m, near_duplicates=True).near_duplicates  # fills the cache
    assert whole is not None and whole.across_splits > 0
    shard = next(  # a shard that holds a pair
        s for s in m.shards if any(s.name in (p.train[0], p.val[0]) for p in whole.examples)
    )
    path = Path(m.root, shard.name)
    data = path.read_bytes()
    for broken in (None, data[:-1] + bytes([data[-1] ^ 1])):  # missing, then one bit off
        if broken is None:
            path.unlink()
        else:
            path.write_bytes(broken)
        warm = _validate(m, near_duplicates=True)
        assert not warm.ok and warm.near_duplicates is not None
        assert warm.near_duplicates.hashed == m.records - shard.records
        assert all(shard.name not in (p.train[0], p.val[0]) for p in warm.near_duplicates.examples)
        assert warm.near_duplicates.across_splits < whole.across_splits
    path.write_bytes(data)
    again = _validate(m, near_duplicates=True).near_duplicates
    assert again is not None and again.across_splits == whole.across_splits


def test_with_no_validation_side_the_check_says_it_compared_nothing(near_tree, tmp_path, cache):
    m = _write(near_tree, tmp_path / "out")
    manifest = str(Path(m.root, "manifest.json"))
    report = validate(ValidateConfig(manifest=manifest, near_duplicates=True))
    assert report.near_duplicates is not None and report.near_duplicates.across_splits == 0
    assert any("no validation side" in line for line in report.warnings)
    assert report.metrics()["near_duplicates"]["across_splits"] is None  # not a clean 0
    assert not any("no validation side" in line for line in _validate(m).warnings)


def test_no_validation_side_says_why_with_the_fraction_asked(near_tree, tmp_path, cache):
    """One shard and val_fraction 0.5 said "no validation side (val_fraction 0)"."""
    config = WriteConfig(out=str(tmp_path / "out"), num_shards=1)
    m = write(config, list_files(str(near_tree)), progress=False).manifest
    report = _validate(m, near_duplicates=True)
    said = [w for w in report.warnings if w.startswith("near-duplicates:")]
    assert said == [
        "near-duplicates: no validation side (val_fraction 0.5 chose no shard of 1), so no "
        "pair was compared"
    ]
