"""The record loop finds the same problems, worded the same, on the C path and the Python one."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

import pytest

from tfshards.format import native
from tfshards.format.example import encode, varint
from tfshards.format.schema import FeatureSpec
from tfshards.format.tfrecord import frame, scan
from tfshards.validation import recordcheck, rules

BASE = (
    FeatureSpec("image", "bytes", ()),
    FeatureSpec("label", "int64", ()),
    FeatureSpec("path", "bytes", ()),
    FeatureSpec("sha256", "bytes", ()),
)


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


def _run(buf: bytes, schema: Sequence[FeatureSpec] = BASE, num_labels: int = 4, **options):
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
        **options,
    )
    return recordcheck.check_records(buf, checker), labels, problems


def _same(buf: bytes, schema: Sequence[FeatureSpec] = BASE) -> tuple:
    """What the Python reference finds, after checking the C loops (where built) find the same."""
    c = native.NATIVE
    native.NATIVE = None
    try:
        python = _run(buf, schema)
    finally:
        native.NATIVE = c
    if c is not None:
        assert _run(buf, schema) == python
    return python


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


def test_transform_scalars_and_lists_are_checked_on_both_paths():
    schema = (*BASE, FeatureSpec("width", "int64", ()), FeatureSpec("xy", "float", (2,)))
    buf = b"".join(
        _record(bytes([i]) * 50, i % 4, f"{i}.bin", width=("int64", [96 + i]), xy=("float", [i, 1]))
        for i in range(20)
    )
    records, labels, problems = _same(buf, schema)
    assert (records, problems, sum(labels)) == (20, [], 20)


def test_a_list_of_the_wrong_size_is_reported_on_both_paths():
    schema = (*BASE, FeatureSpec("xy", "float", (2,)))
    buf = _record(b"a", 0, "a.bin", xy=("float", [1.0, 2.0])) + _record(
        b"b", 1, "b.bin", xy=("float", [1.0])
    )
    records, _, problems = _same(buf, schema)
    assert records == 2
    assert [(p[0], p[1]) for p in problems] == [
        ("feature 'xy': expected 2 values (shape [2]), found 1", 1)
    ]


def test_problems_come_in_record_order():
    rng = random.Random(5)
    records = [bytes(s.data or b"") for s in scan(_shard(60, seed=5, classes=6))]
    damaged = bytearray(b"".join(b"".join(frame([r])) for r in records))
    for _ in range(30):  # data CRC problems among label problems
        damaged[rng.randrange(len(damaged))] ^= 0x10
    _, _, problems = _same(bytes(damaged))
    assert len(problems) > 10
    assert [p[1] for p in problems] == sorted(p[1] for p in problems)


def test_a_new_record_rule_is_one_function():
    def path_is_short(shard: rules.Shard, record: rules.Record) -> str | None:
        path = bytes(record.first("path", b""))
        return None if len(path) < 8 else f"path {path.decode()} is long"

    buf = _record(b"x", 0, "a.bin") + _record(b"y", 1, "longer/b.bin")
    _, _, problems = _run(buf, record_rules=(*rules.RECORD_RULES, path_is_short))
    assert [(p[0], p[1]) for p in problems] == [("path longer/b.bin is long", 1)]
