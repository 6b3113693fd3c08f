"""Differential fuzzing: the C parser and walker against the Python reference, on mutated bytes.

Seeded random Examples (every list kind, empty lists, negative and 10-byte
int64 values, non-ASCII keys, repeated keys) and TFRecord streams are
mutated (bits flipped, protobuf tags and varint bytes written in, bytes cut
out or inserted, the end cut off) and both paths must reach the same verdict
and find the same fields, and, for whole shards, the same problems worded the
same.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from tfshards.format import native
from tfshards.format.example import encode_bytes, varint
from tfshards.format.exampleparser import DecodeError, outline
from tfshards.format.records import _batch, parse_records
from tfshards.format.tfrecord import frame

C = native.NATIVE
pytestmark = pytest.mark.skipif(C is None, reason="tfshards.format._native is not built")

KEYS = ["image", "label", "path", "sha256", "xy", "é", ""]
NAMES = frozenset(["image", "label", "path", "sha256", "xy", "é", "", "absent"])


def _values(rng: random.Random) -> tuple[str, list[Any]]:
    kind = rng.choice(["bytes", "int64", "float"])
    n = rng.choice([0, 1, 1, 1, 2, 5])
    if kind == "bytes":
        return kind, [rng.randbytes(rng.choice([0, 1, 3, 130])) for _ in range(n)]
    if kind == "int64":
        pool = [0, 1, 127, 128, -1, -(1 << 63), (1 << 63) - 1, 1 << 40]
        return kind, [rng.choice(pool) for _ in range(n)]
    return kind, [rng.uniform(-2, 2) for _ in range(n)]


def _example(rng: random.Random) -> bytes:
    features = {key: _values(rng) for key in rng.sample(KEYS, rng.randrange(1, 5))}
    data = encode_bytes(features)  # type: ignore[arg-type]
    if rng.random() < 0.1:  # a repeated key: a second Features message with one entry
        again = encode_bytes({rng.choice(KEYS): _values(rng)})  # type: ignore[dict-item]
        data += again
    return data


def _mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        if not out:
            break
        at = rng.randrange(len(out)) if rng.random() < 0.5 else rng.randrange(min(len(out), 24))
        how = rng.randrange(5)
        if how == 0:
            out[at] ^= 1 << rng.randrange(8)
        elif how == 1:
            out[at] = rng.choice([0x0A, 0x12, 0x1A, 0x22, 0x08, 0x80, 0xFF, 0x00, 0x7F])
        elif how == 2:
            del out[at : at + rng.randrange(1, 4)]
        elif how == 3:
            out[at:at] = rng.choice([b"\x80", b"\xff" * 10, b"\x0a\x00", varint(1 << 62)])
        else:
            del out[rng.randrange(len(out)) :]
    return bytes(out)


def _python(data: bytes) -> object:
    try:
        found = outline(data, NAMES)
    except (DecodeError, UnicodeDecodeError):
        return "refused"
    return _plain(found)


def _plain(found: Any) -> dict[str, tuple[str, int, Any]]:
    return {
        name: (o.dtype, o.size, bytes(o.first) if isinstance(o.first, memoryview) else o.first)
        for name, o in sorted(found.items())
    }


@pytest.mark.parametrize("seed", range(4))
def test_c_and_python_outline_the_same_fields_of_mutated_examples(seed):
    rng = random.Random(seed)
    records = [_mutate(rng, _example(rng)) for _ in range(1500)]
    records += [rng.randbytes(rng.randrange(1, 40)) for _ in range(200)]  # noise
    buf = b"".join(records)
    ends = np.cumsum([len(r) for r in records]).astype(np.int64)
    starts = ends - np.array([len(r) for r in records], dtype=np.int64)
    assert C is not None
    keys = tuple(sorted(n.encode() for n in NAMES))
    ok = C.outline_examples(buf, starts, ends, keys)[0]
    parsed = list(
        _batch(C, memoryview(buf), 0, starts, starts, ends, b"\x01" * len(ok), keys, NAMES)
    )
    verdicts = {"refused": 0, "accepted": 0}
    for i, (record, p) in enumerate(zip(records, parsed, strict=True)):
        python = _python(record)
        verdicts["refused" if python == "refused" else "accepted"] += 1
        assert bool(ok[i]) == (python != "refused"), (i, record)
        if ok[i]:
            assert _plain(p.fields) == python, (i, record)
    assert min(verdicts.values()) > 300  # both verdicts are well represented


def _shard_records(rng: random.Random) -> list[tuple[Any, ...]]:
    records = [_example(rng) for _ in range(rng.randrange(1, 30))]
    buf = bytearray(b"".join(b"".join(frame([r])) for r in records))  # type: ignore[misc]
    for _ in range(rng.choice([0, 1, 2])):
        at = rng.randrange(len(buf))
        if rng.random() < 0.8:
            buf[at] ^= 1 << rng.randrange(8)
        else:
            del buf[at:]
            break
    out = []
    for index, offset, data, fields, problem in parse_records(bytes(buf), NAMES):
        plain = None if fields is None else _plain(fields)
        out.append((index, offset, None if data is None else bytes(data), plain, problem))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_c_and_python_walk_damaged_shards_to_the_same_records_and_words(monkeypatch, seed):
    c_side = [_shard_records(random.Random(seed * 1000 + k)) for k in range(150)]
    monkeypatch.setattr(native, "NATIVE", None)
    python_side = [_shard_records(random.Random(seed * 1000 + k)) for k in range(150)]
    assert c_side == python_side
    problems = [r[4] for shard in python_side for r in shard if r[4]]
    assert any("data CRC" in p for p in problems)
    assert any("length CRC" in p or "truncated" in p for p in problems)
