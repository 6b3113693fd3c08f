"""The wire constants of TFRecord framing and of ``tf.train.Example`` protos, stated once.

Every Python module of the format takes them from here; ``_native.h`` (the C
fast path) states the same numbers as its own ``#define``s, and the tests
compare the two paths' bytes and verdicts.

TFRecord framing::

    uint64 length            little-endian
    uint32 masked_crc32c(length bytes)
    byte   data[length]
    uint32 masked_crc32c(data)

Example (every field length-delimited, wire type 2)::

    Example   { 1: Features }
    Features  { 1: repeated MapEntry { 1: key (string), 2: Feature } }
    Feature   { 1: BytesList { 1: repeated bytes }
              | 2: FloatList { 1: packed float32 }
              | 3: Int64List { 1: packed varint } }
"""

from __future__ import annotations

import struct
from typing import Literal

Dtype = Literal["bytes", "int64", "float"]  # a Feature's kind, as the schema names it
COMPRESSIONS = ("none", "gzip", "zlib")  # a shard file as written: as is, or one stream

# ----------------------------------------------------------------------------- TFRecord
LENGTH = struct.Struct("<Q")  # a record's length field
CRC = struct.Struct("<I")  # a masked CRC-32C
HEADER_BYTES = LENGTH.size + CRC.size  # length (8) + its masked crc (4)
FOOTER_BYTES = CRC.size  # the data's masked crc
MASK_DELTA = 0xA282EAD8  # TFRecord's CRC mask: rotate right by 15 bits, add this
CRC32C_POLYNOMIAL = 0x82F63B78  # Castagnoli, reflected (the ``crc32c`` package; C's table)

# ----------------------------------------------------------------------------- protobuf
LEN = 2  # wire type of a length-delimited field: the only one an Example uses
TAG1 = 1 << 3 | LEN  # 0x0a: Example.features, Features' map entries, an entry's key, each list
TAG2 = 2 << 3 | LEN  # 0x12: a map entry's Feature
KIND_FIELD: dict[Dtype, int] = {"bytes": 1, "float": 2, "int64": 3}  # Feature's oneof field
KIND_TAG: dict[Dtype, int] = {dtype: f << 3 | LEN for dtype, f in KIND_FIELD.items()}
DTYPE_OF_FIELD: dict[int, Dtype] = {f: dtype for dtype, f in KIND_FIELD.items()}
FLOAT32 = "<f4"  # a packed float: little-endian IEEE single
FLOAT_BYTES = 4
MAX_VARINT_BYTES = 10  # an int64 (a negative one takes all ten)
