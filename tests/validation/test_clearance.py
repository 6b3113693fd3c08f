"""Bulk clearances never pass a record their rule fails; the C payload hash is SHA-256."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest

from tfshards.format import native
from tfshards.format.example import encode
from tfshards.format.schema import FeatureSpec
from tfshards.format.tfrecord import frame
from tfshards.validation import recordcheck, rules
from tfshards.validation.batch import parse_batch
from tfshards.validation.clearance import CLEARANCES

C = native.NATIVE
needs_c = pytest.mark.skipif(C is None, reason="tfshards.format._native is not built")

BASE = (
    FeatureSpec("image", "bytes", ()),
    FeatureSpec("label", "int64", ()),
    FeatureSpec("path", "bytes", ()),
    FeatureSpec("sha256", "bytes", ()),
)
HEADS = [b"\xff\xd8\xff\xe0", b"\x89PNG\r\n\x1a\n", b"GIF89a", b"GIF8", b"BM", b"text", b""]


def _features(rng: random.Random) -> dict[str, tuple[str, list]]:
    """One record's features, right or wrong in any of the ways the rules look at."""
    payload = rng.choice(HEADS) + rng.randbytes(rng.randrange(0, 40))
    digest = hashlib.sha256(payload).hexdigest()
    stored = rng.choice([digest, digest.upper(), digest[:-1] + "0", digest[:63], "zz" * 32])
    features: dict[str, tuple[str, list]] = {
        "image": rng.choice([("bytes", [payload]), ("bytes", [payload, b"x"]), ("int64", [3])]),
        "label": rng.choice([("int64", [rng.randrange(-2, 6)]), ("int64", []), ("bytes", [b"1"])]),
        "path": ("bytes", [rng.choice(["a/1.jpg", "b/2.PNG", "c/3.txt", "d/4"]).encode()]),
        "sha256": rng.choice([("bytes", [stored.encode()]), ("bytes", []), ("float", [1.0])]),
    }
    for name in rng.sample(sorted(features), rng.randrange(0, 2)):
        del features[name]  # a missing feature
    return features


@needs_c
@pytest.mark.parametrize("seed", range(5))
def test_a_cleared_record_passes_its_rule(seed):
    assert C is not None
    rng = random.Random(seed)
    buf = b"".join(b"".join(frame(encode(_features(rng))[0])) for _ in range(300))
    batch, refused = parse_batch(C, buf, [s.name for s in BASE])
    assert len(batch) == 300 and not refused
    for shard in (rules.Shard(BASE, "image", 4), rules.Shard(BASE, "image", 4, check_sha=False)):
        for rule, clear in CLEARANCES.items():
            cleared = clear(shard, batch)
            said = [rule(shard, batch.record(row)) for row in np.flatnonzero(cleared).tolist()]
            assert said == [None] * len(said), rule.__name__
        # The gate's clearance is exact: the records it leaves are the ones it fails.
        gate = CLEARANCES[rules.conforms_to_schema](shard, batch)
        fails = [rules.conforms_to_schema(shard, batch.record(r)) for r in range(len(batch))]
        assert gate.tolist() == [f is None for f in fails]


@needs_c
@pytest.mark.parametrize("lanes", ["0", "1", "2"])
def test_payload_hashes_are_sha256_on_every_path(monkeypatch, lanes):
    assert C is not None
    monkeypatch.setenv("TFSHARDS_SHA_LANES", lanes)  # 0: OpenSSL; 1: AVX2; 2: AVX-512VL lanes
    rng = random.Random(int(lanes))
    buf = rng.randbytes(20_000)
    sizes = [*range(0, 140), 183, 247, 4096, 9000] + [rng.randrange(0, 5000) for _ in range(50)]
    starts = np.array([rng.randrange(0, len(buf) - n + 1) for n in sizes], dtype=np.int64)
    ends = starts + np.array(sizes, dtype=np.int64)
    digests = C.hash_spans(buf, starts, ends)
    want = b"".join(hashlib.sha256(buf[a:b]).digest() for a, b in zip(starts, ends, strict=True))
    assert digests == want
    assert C.hash_spans(buf, starts[:0], ends[:0]) == b""
    with pytest.raises(ValueError, match="outside a buffer"):
        C.hash_spans(buf, np.array([5], dtype=np.int64), np.array([len(buf) + 1], dtype=np.int64))


@needs_c
def test_heads_are_each_value_s_first_bytes_zero_padded():
    assert C is not None
    rng = random.Random(3)
    values = [rng.randbytes(rng.randrange(0, 80)) for _ in range(40)]
    buf = b"".join(b"".join(frame(encode({"v": ("bytes", [v])})[0])) for v in values)
    batch, _ = parse_batch(C, buf, ["v"])
    for size in (1, 18, 64, 100):
        want = [list(v[:size].ljust(size, b"\0")) for v in values]
        assert batch.heads("v", size).tolist() == want


@pytest.mark.parametrize(
    "stored", [b"ab" * 32, b"AB" * 32, b"ab" * 30 + b" cd ", b"g" * 64, b"ab" * 31]
)
def test_digests_kept_are_64_hex_digits_on_both_paths(monkeypatch, stored):
    buf = b"".join(frame(encode({"sha256": ("bytes", [stored])})[0]))
    schema = [FeatureSpec("sha256", "bytes", ())]
    kept = []
    for c in (C, None):
        monkeypatch.setattr(native, "NATIVE", c)
        digests = bytearray(32)
        checker = recordcheck.RecordChecker(
            schema, "image", num_labels=0, check_sha=True, decode_images=False,
            labels=[], add=lambda *_: None, digests=digests,
        )  # fmt: skip
        assert recordcheck.check_records(buf, checker) == 1
        kept.append(bytes(digests))
    want = bytes.fromhex(stored.decode()) if stored in (b"ab" * 32, b"AB" * 32) else bytes(32)
    assert kept == [want, want]
