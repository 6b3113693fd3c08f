"""Encode ``tf.train.Example`` protos byte-deterministically, without TensorFlow.

The encoder writes the protobuf wire format directly, features in sorted key
order, so its bytes equal ``Example.SerializeToString(deterministic=True)``
(the tests check this against TensorFlow) in every interpreter. The default
``SerializeToString()`` orders the feature map differently from one process to
the next (two runs over the same data were seen to write different bytes),
which would make every run's shards differ. The wire format is in
:mod:`tfshards.format.wire`; parsing lives in
:mod:`tfshards.format.exampleparser`, feature specs in :mod:`tfshards.format.schema`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import cast

import numpy as np

from tfshards.format import wire
from tfshards.format.schema import Values
from tfshards.format.wire import Dtype

__all__ = [
    "bytes_entry_head",
    "encode",
    "encode_around",
    "encode_bytes",
    "example_head",
    "varint",
]

Piece = bytes | memoryview

_TAG1 = bytes([wire.TAG1])
_TAG2 = bytes([wire.TAG2])
_KIND_TAG = {dtype: bytes([tag]) for dtype, tag in wire.KIND_TAG.items()}


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
            packed = np.asarray(values, dtype=wire.FLOAT32).tobytes()
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


@functools.lru_cache(maxsize=1 << 16)  # the sizes of a typical data set; a few MB at most
def bytes_entry_head(name: str, n: int) -> bytes:
    """The bytes of a one-value ``bytes`` feature entry that precede its ``n``-byte value.

    A map entry is this head followed by the value; several entries, in sorted
    key order, behind :func:`example_head` make an Example (see :func:`encode`).
    """
    return _scalar_bytes_head(_key_field(name), n)


def example_head(body_len: int) -> bytes:
    """The bytes that open an Example whose entries take ``body_len`` bytes."""
    return _TAG1 + varint(body_len)


def _entry(name: str, dtype: Dtype, values: Values) -> bytes:
    key_field = _key_field(name)
    feat_pieces, feat_len = _feature_pieces(dtype, values)
    value_head = _TAG2 + varint(feat_len)
    entry_len = len(key_field) + len(value_head) + feat_len
    return b"".join([_TAG1, varint(entry_len), key_field, value_head, *feat_pieces])


def _body(
    features: Mapping[str, tuple[Dtype, Values]], hole: str | None = None, hole_size: int = 0
) -> tuple[list[Piece], int, int, int]:
    """An Example's entries in sorted key order as pieces, and their length.

    A one-value ``bytes`` feature is two pieces, its head and its value (passed
    through, never copied); every other feature one piece. With ``hole``: that
    one-value ``bytes`` feature of ``hole_size`` bytes is one more entry, its
    value left out: the last two items are the index of the piece its value
    precedes and the value's offset in the entries (-1 and 0 without).
    """
    body: list[Piece] = []
    body_len, cut, at = 0, -1, 0
    for name in sorted(features if hole is None else (*features, hole)):
        if name == hole:
            head = bytes_entry_head(name, hole_size)
            body.append(head)
            cut, at = len(body), body_len + len(head)
            body_len = at + hole_size
            continue
        dtype, values = features[name]
        if len(values) == 1 and dtype == "bytes":  # payloads, paths, hashes: the hot path
            value = cast(bytes, values[0])
            head = bytes_entry_head(name, len(value))
            body += (head, value)
            body_len += len(head) + len(value)
        else:
            if len(values) == 1 and dtype == "int64":
                entry = _scalar_int_entry(name, int(values[0]))
            else:
                entry = _entry(name, dtype, values)
            body.append(entry)
            body_len += len(entry)
    return body, body_len, cut, at


def encode(features: Mapping[str, tuple[Dtype, Values]]) -> tuple[list[Piece], int]:
    """Serialize an Example from ``{name: (dtype, flat values)}``.

    Returns the pieces to write and their total length. Keys are written in
    sorted order. A record under 64 KiB comes back as one piece; larger
    payloads are passed through as their own pieces, never copied.
    """
    body, body_len, _, _ = _body(features)
    head = example_head(body_len)
    total = len(head) + body_len
    if total < _JOIN_BELOW:
        return [b"".join([head, *body])], total
    return [head, *body], total


def encode_around(
    features: Mapping[str, tuple[Dtype, Values]], name: str, size: int
) -> tuple[list[Piece], list[Piece], int, int]:
    """:func:`encode` of ``features`` and one more, a ``size``-byte ``bytes`` value of
    feature ``name`` that is left out: the pieces before it and after it, the
    value's offset and the Example's length. A writer fills the value in place
    (a file read straight into it).
    """
    body, body_len, cut, at = _body(features, name, size)
    head = example_head(body_len)
    return [head, *body[:cut]], body[cut:], len(head) + at, len(head) + body_len


def encode_bytes(features: Mapping[str, tuple[Dtype, Values]]) -> bytes:
    """:func:`encode`, joined into one ``bytes`` object."""
    return b"".join(encode(features)[0])
