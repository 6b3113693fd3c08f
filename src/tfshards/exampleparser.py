"""Parse ``tf.train.Example`` bytes without TensorFlow: decode them, or outline them for checks.

:func:`decode` returns every feature's values; :func:`outline` returns what
the record checks need (each named feature's kind, number of values and first
value) with the same errors, in memory bounded by the names asked for. The
wire format is in :mod:`tfshards.example`, which writes it.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from tfshards.schema import Dtype, FeatureSpec


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
