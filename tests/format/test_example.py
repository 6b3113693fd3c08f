"""The hand-written Example encoder matches protobuf's deterministic bytes, and decodes back."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from tfshards.format import example, exampleparser, schema

CASES = {
    "image": ("bytes", [b"\xff\xd8" + bytes(range(256)) * 20]),
    "label": ("int64", [3]),
    "neg": ("int64", [-1, -(2**63), 2**63 - 1, 0, 300]),
    "floats": ("float", [1.5, -2.25, 0.0]),
    "empty_f": ("float", []),
    "empty_i": ("int64", []),
    "empty_b": ("bytes", []),
    "many": ("bytes", [b"a", b"", b"ccc"]),
    "unicode_é": ("bytes", ["ünï".encode()]),
}


def _tf_bytes(features):
    import tensorflow as tf

    def feature(dtype, values):
        if dtype == "bytes":
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
        if dtype == "int64":
            return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))

    ex = tf.train.Example(
        features=tf.train.Features(feature={k: feature(*v) for k, v in features.items()})
    )
    return ex.SerializeToString(deterministic=True)


def test_encoding_equals_protobuf_deterministic_serialization():
    assert example.encode_bytes(CASES) == _tf_bytes(CASES)


@pytest.mark.parametrize("size", [127, 128, 16383, 16384, 100_000, (1 << 21) + 5])
def test_large_payload_lengths_encode_like_protobuf(size):
    features = {"image": ("bytes", [b"\x01" * size]), "n": ("int64", [size, -size])}
    assert example.encode_bytes(features) == _tf_bytes(features)


def test_encoding_is_independent_of_dict_order():
    reversed_cases = dict(reversed(list(CASES.items())))
    assert example.encode_bytes(reversed_cases) == example.encode_bytes(CASES)


def test_tensorflow_parses_our_encoding():
    import tensorflow as tf

    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "neg": tf.io.FixedLenFeature([5], tf.int64),
        "floats": tf.io.FixedLenFeature([3], tf.float32),
    }
    parsed = tf.io.parse_single_example(example.encode_bytes(CASES), spec)
    assert parsed["image"].numpy() == CASES["image"][1][0]
    assert int(parsed["label"]) == 3
    assert parsed["neg"].numpy().tolist() == CASES["neg"][1]
    assert parsed["floats"].numpy().tolist() == [1.5, -2.25, 0.0]


def test_decode_round_trips():
    decoded = exampleparser.decode(example.encode_bytes(CASES))
    assert set(decoded) == set(CASES)
    for name, (dtype, values) in CASES.items():
        got_dtype, got = decoded[name]
        assert [bytes(v) if dtype == "bytes" else v for v in got] == values
        if values:
            assert got_dtype == dtype


def test_decode_rejects_garbage():
    with pytest.raises(exampleparser.DecodeError):
        exampleparser.decode(b"\x0a\xff\xff\xff\x0f")


def test_conformance_names_missing_and_wrong_features():
    specs = (
        schema.FeatureSpec("image", "bytes", ()),
        schema.FeatureSpec("label", "int64", ()),
        schema.FeatureSpec("vec", "float", (2,)),
    )
    ok = {"image": ("bytes", [b"x"]), "label": ("int64", [1]), "vec": ("float", [1.0, 2.0])}
    assert (
        exampleparser.conformance_problem(exampleparser.decode(example.encode_bytes(ok)), specs)
        is None
    )
    missing = {k: v for k, v in ok.items() if k != "label"}
    problem = exampleparser.conformance_problem(
        exampleparser.decode(example.encode_bytes(missing)), specs
    )
    assert problem == "feature 'label' missing"
    short = {**ok, "vec": ("float", [1.0])}
    problem = exampleparser.conformance_problem(
        exampleparser.decode(example.encode_bytes(short)), specs
    )
    assert problem is not None and "expected 2 values" in problem and "found 1" in problem


def _verdict(data: bytes, names: set[str], use_outline: bool) -> object:
    """What decode or outline makes of ``data``: each named feature's kind, count, first value."""
    try:
        if use_outline:
            found = exampleparser.outline(data, names)
            return {
                k: (o.dtype, o.size, o.first if o.dtype != "float" else None)
                for k, o in found.items()
            }
        decoded = exampleparser.decode(data)
    except (exampleparser.DecodeError, UnicodeDecodeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return {
        k: (dtype, len(values), values[0] if values and dtype != "float" else None)
        for k, (dtype, values) in decoded.items()
        if k in names
    }


@pytest.mark.parametrize("seed", range(6))
def test_outline_agrees_with_decode_on_mutated_examples(seed):
    rng = random.Random(seed)
    clean = example.encode_bytes(CASES)
    names = {"image", "label", "neg", "floats", "empty_i", "many"}  # some, not all
    for _ in range(400):
        data = bytearray(clean)
        for _ in range(rng.choice([1, 1, 2, 3])):
            pos = rng.randrange(len(data))
            data[pos] = rng.choice([data[pos] ^ (1 << rng.randrange(8)), 0x0A, 0x12, 0x80, 0xFF, 0])
        if rng.random() < 0.2:
            data = data[: rng.randrange(len(data))]
        assert _verdict(bytes(data), names, True) == _verdict(bytes(data), names, False)


def test_outline_of_many_fields_holds_no_list_of_them():
    many = b"\x0a\x00" * 200_000  # as a list of (number, memoryview): ~40 MB
    tracemalloc.start()
    try:
        assert exampleparser.outline(many, {"image"}) == {}
        assert tracemalloc.get_traced_memory()[1] < 1 << 20  # peak of Python allocations
    finally:
        tracemalloc.stop()


def test_named_values_reads_the_named_int_and_float_features_as_decode_does() -> None:
    pieces, _ = example.encode(
        {
            "image": ("bytes", [b"\x01" * 300]),
            "tags": ("int64", [3, -1, 1 << 40]),
            "box": ("float", [0.0, 0.25, 1.5, -2.0]),
            "none": ("int64", []),
            "label": ("int64", [7]),
        }
    )
    record = b"".join(pieces)
    found = exampleparser.named_values(record, {"tags", "box", "none", "image"})
    full = exampleparser.decode(record)
    assert found["tags"] == full["tags"] == ("int64", [3, -1, 1 << 40])
    assert found["box"] == ("float", [float(v) for v in full["box"][1]])
    assert found["none"][1] == [] and found["image"] == ("bytes", [])
    assert "label" not in found
