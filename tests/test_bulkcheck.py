"""The bulk record checks find exactly what the per-record checks find, worded the same."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

import pytest

from tfshards import bulkcheck, recordcheck
from tfshards.example import FeatureSpec, encode, varint
from tfshards.tfrecord import frame, scan

BASE = (
    FeatureSpec("image", "bytes", ()),
    FeatureSpec("label", "int64", ()),
    FeatureSpec("path", "bytes", ()),
    FeatureSpec("sha256", "bytes", ()),
)


@pytest.fixture(autouse=True)
def both_loops(loop: str) -> str:
    """Every test here on the compiled span loops and on the pure-Python ones."""
    return loop


def _record(payload: bytes, label: int, path: str, **extra: tuple[str, list]) -> bytes:
    features = {
        "image": ("bytes", [payload]),
        "label": ("int64", [label]),
        "path": ("bytes", [path.encode()]),
        "sha256": ("bytes", [hashlib.sha256(payload).hexdigest().encode()]),
        **extra,
    }
    return b"".join(frame(encode(features)[0]))  # type: ignore[arg-type]


def _shard(n: int, seed: int = 0, big: int = 0, classes: int = 4) -> bytes:
    rng = random.Random(seed)
    sizes = [rng.randrange(1, 300) for _ in range(n)] + [big] * bool(big)
    return b"".join(
        _record(rng.randbytes(size), rng.randrange(classes), f"c/{i:04d}.bin")
        for i, size in enumerate(sizes)
    )


def _run(check, buf: bytes, schema: Sequence[FeatureSpec] = BASE, num_labels: int = 4):
    problems: list[tuple[str, int, int]] = []
    labels = [0] * num_labels
    checker = recordcheck.RecordChecker(
        schema,
        "image",
        num_labels=num_labels,
        check_sha=True,
        decode_images=False,
        labels=labels,
        add=lambda what, index, offset: problems.append((what, index, offset)),
    )
    return check(buf, checker), labels, problems


def _same(buf: bytes, schema: Sequence[FeatureSpec] = BASE) -> tuple:
    bulk = _run(bulkcheck.check_records, buf, schema)
    assert bulk == _run(recordcheck.check_records, buf, schema)
    return bulk


def test_clean_shard_counts_records_and_labels_with_no_problems():
    records, labels, problems = _same(_shard(200))
    assert (records, problems, sum(labels)) == (200, [], 200)
    assert min(labels) > 0


def test_out_of_range_labels_are_reported_per_record():
    records, labels, problems = _same(_shard(100, seed=3, classes=5))  # 4 is out of range
    out_of_range = [p for p in problems if p[0].startswith("label out of range")]
    assert out_of_range and records == 100
    assert sum(labels) + len(out_of_range) == 100


@pytest.mark.parametrize("seed", range(12))
def test_any_flipped_byte_is_reported_the_same_way(seed):
    clean = _shard(30, seed=seed, big=20_000 if seed % 3 == 0 else 0)
    rng = random.Random(seed)
    for _ in range(40):
        damaged = bytearray(clean)
        damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        _same(bytes(damaged))


@pytest.mark.parametrize("seed", range(12))
def test_damaged_examples_with_valid_crcs_are_reported_the_same_way(seed):
    """A writer bug, not disk damage: the framing is right, the Example inside is not."""
    rng = random.Random(seed)
    records = [bytes(s.data or b"") for s in scan(_shard(12, seed=seed))]
    for _ in range(60):
        i = rng.randrange(len(records))
        data = bytearray(records[i])
        pos = rng.randrange(min(len(data), 40)) if rng.random() < 0.7 else rng.randrange(len(data))
        data[pos] = rng.choice([data[pos] ^ (1 << rng.randrange(8)), 0x0A, 0x12, 0x80, 0xFF, 0])
        damaged = [*records[:i], bytes(data), *records[i + 1 :]]
        _same(b"".join(b"".join(frame([r])) for r in damaged))


@pytest.mark.parametrize("cut", [1, 5, 12, 15, 100, 2000])
def test_truncated_shards_are_reported_the_same_way(cut):
    clean = _shard(20)
    assert _same(clean[:-cut])[2]


def test_records_of_another_layout_take_the_per_record_path():
    # A record holding an extra feature, and one with a stored hash that is not 64 hex digits.
    odd = _record(b"x" * 10, 1, "a.bin", extra=("bytes", [b"?"]))
    wrong_hash = b"".join(
        frame(
            encode(
                {
                    "image": ("bytes", [b"y"]),
                    "label": ("int64", [2]),
                    "path": ("bytes", [b"b.bin"]),
                    "sha256": ("bytes", [b"ABCD"]),
                }
            )[0]
        )
    )
    records, _, problems = _same(_shard(10) + odd + wrong_hash + _shard(5, seed=1))
    assert records == 17
    assert any("sha256" in p[0] and p[1] == 11 for p in problems)
    assert not any(p[1] == 10 for p in problems)  # a feature the schema does not name is fine


def _entries(features: dict) -> bytes:
    """An Example's map entries: its bytes after ``0x0a varint(length)``."""
    ex = b"".join(encode(features)[0])
    end_of_length = next(k for k in range(1, 11) if ex[k] < 0x80)
    return ex[end_of_length + 1 :]


def test_a_repeated_feature_entry_is_read_as_tensorflow_does_last_wins():
    good = {
        "image": ("bytes", [b"z"]),
        "label": ("int64", [1]),
        "path": ("bytes", [b"z.bin"]),
        "sha256": ("bytes", [hashlib.sha256(b"z").hexdigest().encode()]),
    }
    body = _entries(good) + _entries({"sha256": ("bytes", [b"0" * 64])})
    record = b"".join(frame([b"\x0a" + varint(len(body)) + body]))
    _, _, problems = _same(_shard(3) + record)
    assert [p[1] for p in problems] == [3]
    assert "sha256" in problems[0][0]


def test_transform_scalars_take_the_bulk_path():
    schema = (*BASE, FeatureSpec("width", "int64", ()))
    buf = b"".join(
        _record(bytes([i]) * 50, i % 4, f"{i}.bin", width=("int64", [96 + i])) for i in range(20)
    )
    assert bulkcheck.supports(schema, decode_images=False)
    records, labels, problems = _same(buf, schema)
    assert (records, problems, sum(labels)) == (20, [], 20)


def test_lists_and_decoding_use_the_per_record_path():
    assert not bulkcheck.supports((*BASE, FeatureSpec("emb", "float", (4,))), decode_images=False)
    assert not bulkcheck.supports(BASE, decode_images=True)


@pytest.mark.parametrize("limit", [1, 7, 20])
def test_a_limit_keeps_the_first_problems_in_record_order_and_counts_the_rest(limit):
    rng = random.Random(limit)
    records = [bytes(s.data or b"") for s in scan(_shard(60, seed=limit, classes=6))]
    damaged = bytearray(b"".join(b"".join(frame([r])) for r in records))
    for _ in range(30):  # data CRC problems among label problems, found in another pass
        damaged[rng.randrange(len(damaged))] ^= 0x10
    _, _, everything = _run(bulkcheck.check_records, bytes(damaged))
    assert len(everything) > limit
    kept: list[tuple[str, int, int]] = []
    skipped: list[int] = []
    checker = recordcheck.RecordChecker(
        BASE,
        "image",
        num_labels=4,
        check_sha=True,
        decode_images=False,
        labels=[0] * 4,
        add=lambda what, index, offset: kept.append((what, index, offset)),
        limit=limit,
        skip=skipped.append,
    )
    bulkcheck.check_records(bytes(damaged), checker)
    assert kept == everything[:limit]
    assert sum(skipped) == len(everything) - limit
