"""Encode and decode ``tf.train.Example`` protos byte-deterministically, without TensorFlow.

The encoder writes the protobuf wire format directly, features in sorted key
order, so its bytes equal ``Example.SerializeToString(deterministic=True)``
(the tests check this against TensorFlow) in every interpreter. The default
``SerializeToString()`` orders the feature map differently from one process to
the next (two runs over the same data were seen to write different bytes),
which would make every run's shards differ.

Wire format (all fields length-delimited unless noted)::

    Example   { 1: Features }
    Features  { 1: repeated MapEntry { 1: key (string), 2: Feature } }
    Feature   { 1: BytesList { 1: repeated bytes }
              | 2: FloatList { 1: packed float32 }
              | 3: Int64List { 1: packed varint } }
"""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, cast

import numpy as np

from tfshards.schema import (  # re-exported: the schema travels with the encoding
    DTYPES,
    Dtype,
    FeatureSpec,
    Values,
    merge_specs,
    normalize,
    schema_from_json,
    schema_to_json,
)

__all__ = [
    "DTYPES",
    "DecodeError",
    "Dtype",
    "FeatureSpec",
    "Outline",
    "Values",
    "bytes_entry_head",
    "conformance_problem",
    "decode",
    "encode",
    "encode_bytes",
    "int64_entry",
    "merge_specs",
    "normalize",
    "outline",
    "outline_problem",
    "schema_from_json",
    "schema_to_json",
    "varint",
]

Piece = bytes | memoryview

_TAG1 = b"\x0a"  # field 1, length-delimited
_TAG2 = b"\x12"  # field 2, length-delimited
_TAG3 = b"\x1a"  # field 3, length-delimited
_KIND_TAG: dict[str, bytes] = {"bytes": _TAG1, "float": _TAG2, "int64": _TAG3}


# ----------------------------------------------------------------------------- encode


def _slow_varint(n: int) -> bytes:
    n &= 0xFFFFFFFFFFFFFFFF  # negative int64 values take 10 bytes
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_VARINTS = [_slow_varint(i) for i in range(1 << 14)]  # every length below 16 KiB: one lookup
_JOIN_BELOW = 64 << 10  # smaller records are joined into one bytes (one memcpy beats many calls)


def varint(n: int) -> bytes:
    """Protobuf base-128 varint; negative int64 values take 10 bytes."""
    if 0 <= n < 16384:
        return _VARINTS[n]
    if 0 <= n < 1 << 21:  # lengths of payloads up to 2 MiB: three bytes, no loop
        return bytes(((n & 0x7F) | 0x80, ((n >> 7) & 0x7F) | 0x80, n >> 14))
    return _slow_varint(n)


@functools.lru_cache(maxsize=1024)
def _key_field(name: str) -> bytes:
    key = name.encode()
    return _TAG1 + varint(len(key)) + key


def _feature_pieces(dtype: Dtype, values: Values) -> tuple[list[Piece], int]:
    """Pieces and byte length of one ``Feature`` message."""
    if dtype == "bytes":
        if len(values) == 1:  # the common case: one payload, no loop
            v = cast(bytes, values[0])
            head = _TAG1 + varint(len(v))
            inner = len(head) + len(v)
            return [_TAG1 + varint(inner) + head, v], inner + 1 + len(varint(inner))
        pieces: list[Piece] = []
        inner = 0
        for v in cast(list[bytes], values):
            head = _TAG1 + varint(len(v))
            pieces += (head, v)
            inner += len(head) + len(v)
    else:
        if dtype == "float":
            packed = np.asarray(values, dtype="<f4").tobytes()
        else:
            packed = b"".join([varint(int(v)) for v in values])
        pieces = [_TAG1 + varint(len(packed)), packed] if len(packed) else []
        inner = sum(len(p) for p in pieces)
    head = _KIND_TAG[dtype] + varint(inner)
    return [head, *pieces], len(head) + inner


def _scalar_bytes_head(key_field: bytes, n: int) -> bytes:
    """Everything of a one-value ``bytes`` map entry that precedes the value itself."""
    len_v = varint(n)
    list_len = 1 + len(len_v) + n
    len_list = varint(list_len)
    feat_len = 1 + len(len_list) + list_len
    len_feat = varint(feat_len)
    entry_len = len(key_field) + 1 + len(len_feat) + feat_len
    return b"".join(
        (_TAG1, varint(entry_len), key_field, _TAG2, len_feat, _TAG1, len_list, _TAG1, len_v)
    )


@functools.lru_cache(maxsize=4096)
def _scalar_int_entry(name: str, value: int) -> bytes:
    return _entry(name, "int64", [value])


def bytes_entry_head(name: str, n: int) -> bytes:
    """The bytes of a one-value ``bytes`` feature entry that precede its ``n``-byte value.

    A map entry is this head followed by the value; several entries, in sorted
    key order, behind ``0x0a varint(total)`` make an Example (see :func:`encode`).
    """
    return _scalar_bytes_head(_key_field(name), n)


def int64_entry(name: str, value: int) -> bytes:
    """A whole one-value ``int64`` feature entry."""
    return _scalar_int_entry(name, value)


def _entry(name: str, dtype: Dtype, values: Values) -> bytes:
    key_field = _key_field(name)
    feat_pieces, feat_len = _feature_pieces(dtype, values)
    value_head = _TAG2 + varint(feat_len)
    entry_len = len(key_field) + len(value_head) + feat_len
    return b"".join([_TAG1, varint(entry_len), key_field, value_head, *feat_pieces])


def encode(features: Mapping[str, tuple[Dtype, Values]]) -> tuple[list[Piece], int]:
    """Serialize an Example from ``{name: (dtype, flat values)}``.

    Returns the pieces to write and their total length. Keys are written in
    sorted order. A record under 64 KiB comes back as one piece; larger
    payloads are passed through as their own pieces, never copied.
    """
    body: list[Piece] = []
    body_len = 0
    for name in sorted(features):
        dtype, values = features[name]
        if len(values) == 1 and dtype == "bytes":  # payloads, paths, hashes: the hot path
            value = cast(bytes, values[0])
            head = _scalar_bytes_head(_key_field(name), len(value))
            body.append(head)
            body.append(value)
            body_len += len(head) + len(value)
        else:
            if len(values) == 1 and dtype == "int64":
                entry = _scalar_int_entry(name, int(values[0]))
            else:
                entry = _entry(name, dtype, values)
            body.append(entry)
            body_len += len(entry)
    head = _TAG1 + varint(body_len)
    total = len(head) + body_len
    if total < _JOIN_BELOW:
        return [b"".join([head, *body])], total
    return [head, *body], total


def encode_bytes(features: Mapping[str, tuple[Dtype, Values]]) -> bytes:
    """:func:`encode`, joined into one ``bytes`` object."""
    return b"".join(encode(features)[0])


# ----------------------------------------------------------------------------- decode


class DecodeError(ValueError):
    """The bytes are not a well-formed ``tf.train.Example``."""


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise DecodeError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise DecodeError("varint longer than 10 bytes")


def _field_spans(buf: memoryview) -> Iterator[tuple[int, int, int]]:
    """``(field number, start, end)`` of each length-delimited field of a message."""
    pos = 0
    end = len(buf)
    while pos < end:
        key = buf[pos]  # one-byte varints inline: a call costs more than the decoding
        pos += 1
        if key > 0x7F:
            key, pos = _read_varint(buf, pos - 1)
        if key & 7 != 2:
            raise DecodeError(
                f"field {key >> 3}: wire type {key & 7}, expected 2 (length-delimited)"
            )
        if pos >= end:
            raise DecodeError("truncated varint")
        length = buf[pos]
        pos += 1
        if length > 0x7F:
            length, pos = _read_varint(buf, pos - 1)
        if pos + length > end:
            raise DecodeError(f"field {key >> 3}: length {length} runs past the message end")
        yield key >> 3, pos, pos + length
        pos += length


def _fields(buf: memoryview) -> Iterator[tuple[int, memoryview]]:
    """Split a message into (field number, payload) for length-delimited fields.

    The whole message's framing is checked first, so a problem anywhere in it
    is raised before any field is looked into (the order an eager split meets
    them); the fields then come one at a time: a message of ten million empty
    fields costs no list of ten million.
    """
    for _ in _field_spans(buf):
        pass
    return ((num, buf[start:end]) for num, start, end in _field_spans(buf))


_FLOAT = struct.Struct("<f")


def decode(data: bytes | memoryview) -> dict[str, tuple[Dtype, list[Any]]]:
    """Parse an Example into ``{name: (dtype, values)}``; bytes values are memoryviews.

    Raises:
        DecodeError: the bytes are not a well-formed Example.
    """
    features: dict[str, tuple[Dtype, list[Any]]] = {}
    for num, msg in _fields(memoryview(data)):
        if num != 1:
            continue
        for entry_num, entry in _fields(msg):
            if entry_num != 1:
                continue
            key = ""
            dtype: Dtype = "bytes"
            values: list[Any] = []
            for f, payload in _fields(entry):
                if f == 1:
                    key = bytes(payload).decode()
                elif f == 2:
                    dtype, values = _decode_feature(payload)
            features[key] = (dtype, values)
    return features


def _decode_feature(msg: memoryview) -> tuple[Dtype, list[Any]]:
    first = next(_fields(msg), None)
    if first is None:
        return "bytes", []
    kind, payload = first
    inner = _fields(payload)
    if kind == 1:
        return "bytes", [p for _, p in inner]
    if kind == 2:
        packed = b"".join(bytes(p) for _, p in inner)
        if len(packed) % 4:
            raise DecodeError(f"float list of {len(packed)} bytes is not a multiple of 4")
        return "float", list(np.frombuffer(packed, "<f4"))
    if kind == 3:
        ints = []
        for _, p in inner:
            pos = 0
            while pos < len(p):
                v, pos = _read_varint(p, pos)
                ints.append(v - (1 << 64) if v >= 1 << 63 else v)
        return "int64", ints
    raise DecodeError(f"feature kind {kind} is not bytes_list, float_list or int64_list")


class Outline(NamedTuple):
    """One feature as :func:`outline` sees it: its kind, its number of values, its first."""

    dtype: Dtype
    size: int  # number of values
    first: Any  # bytes: a memoryview; int64: an int; float or no values: None


_LONG_VARINT = re.compile(rb"[\x80-\xff]{10}")  # ten bytes that all say "more follows"
_HIGH_BYTES = bytes(range(0x80, 0x100))


def outline(data: bytes | memoryview, names: Collection[str]) -> dict[str, Outline]:
    """:func:`decode`'s verdict on ``data``, keeping only the features in ``names``.

    Raises the same :class:`DecodeError` (or ``UnicodeDecodeError`` for a key)
    as :func:`decode`, but builds no list of values: memory stays bounded by
    the number of ``names`` whatever the record holds (a 20 MB record can hold
    ten million fields).
    """
    features: dict[str, Outline] = {}
    for num, msg in _fields(memoryview(data)):
        if num != 1:
            continue
        if not msg:
            continue
        for entry_num, entry in _fields(msg):
            if entry_num != 1 or not (entry or "" in names):
                continue
            key = ""
            found = Outline("bytes", 0, None)
            for f, payload in _fields(entry):
                if f == 1:
                    key = bytes(payload).decode()
                elif f == 2:
                    found = _outline_feature(payload)
            if key in names:
                features[key] = found
    return features


def _outline_feature(msg: memoryview) -> Outline:
    """:func:`_decode_feature`'s kind and problems, counting the values instead of listing them."""
    first = next(_fields(msg), None)
    if first is None:
        return Outline("bytes", 0, None)
    kind, payload = first
    inner = _fields(payload)
    if kind == 1:
        count, head = 0, None
        for _, p in inner:
            head = p if not count else head
            count += 1
        return Outline("bytes", count, head)
    if kind == 2:
        length = sum(len(p) for _, p in inner)
        if length % 4:
            raise DecodeError(f"float list of {length} bytes is not a multiple of 4")
        return Outline("float", length // 4, None)
    if kind == 3:
        count, value = 0, None
        for _, p in inner:
            raw = p.tobytes()
            if _LONG_VARINT.search(raw):
                raise DecodeError("varint longer than 10 bytes")
            if raw and raw[-1] & 0x80:
                raise DecodeError("truncated varint")
            if value is None and raw:
                value = _read_varint(p, 0)[0]
                value = value - (1 << 64) if value >= 1 << 63 else value
            count += len(raw.translate(None, _HIGH_BYTES))  # each varint ends in one low byte
        return Outline("int64", count, value)
    raise DecodeError(f"feature kind {kind} is not bytes_list, float_list or int64_list")


def conformance_problem(
    decoded: Mapping[str, tuple[Dtype, list[Any]]], schema: Sequence[FeatureSpec]
) -> str | None:
    """Say how a decoded Example breaks the schema, or None if it conforms."""
    return outline_problem(
        {name: Outline(dtype, len(values), None) for name, (dtype, values) in decoded.items()},
        schema,
    )


def outline_problem(found: Mapping[str, Outline], schema: Sequence[FeatureSpec]) -> str | None:
    """:func:`conformance_problem` on what :func:`outline` found."""
    for spec in schema:
        if spec.name not in found:
            return f"feature {spec.name!r} missing"
        dtype, count, _ = found[spec.name]
        if dtype != spec.dtype and count:
            return f"feature {spec.name!r}: expected dtype {spec.dtype}, found {dtype}"
        if spec.size is not None and count != spec.size:
            shape = list(spec.shape or ())
            return (
                f"feature {spec.name!r}: expected {spec.size} values (shape {shape}), found {count}"
            )
    return None
