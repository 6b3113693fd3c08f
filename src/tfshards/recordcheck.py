"""Check the records of a decompressed shard: framing, Example layout, labels, hashes, images."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import re
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import crc32c

from tfshards import tfrecord as tfr
from tfshards.example import DecodeError, FeatureSpec, outline, outline_problem
from tfshards.imageformat import HEAD_BYTES, claims_image, image_format, not_an_image
from tfshards.tfrecord import FOOTER_BYTES, HEADER_BYTES
from tfshards.writing.grouping import GroupBy


def check_records(buf: bytes, checker: RecordChecker) -> int:
    """Check every record of the decompressed shard ``buf``; returns how many the framing holds.

    Records take a fast path (``_Plan.check``, ~3 us for four features where
    ``example.decode`` + ``conformance_problem`` take ~20) that walks the canonical
    layout :func:`tfshards.example.encode` writes, with int indexing on the shard
    bytes and no lists built. A record it does not accept goes through the general
    decoder, which decides and words the problem, so both paths accept the same
    records and report the same words. Offsets count in the decompressed stream.
    """
    view = memoryview(buf)
    records = 0
    for index, offset, start, end, problem in _frames(buf):
        if problem is not None:
            checker.add(problem, index, offset)
            if start < 0:  # the framing cannot be trusted past here
                break
            records += 1  # a data CRC problem: the bytes are damaged, parsing says no more
            continue
        records += 1
        checker.check(buf, view, index, offset, start, end)
    return records


class RecordChecker:
    """What to check in each record of one shard, and where its problems go.

    Args:
        schema: the features each record must hold, as the manifest lists them.
        image_feature: the feature holding the raw file bytes.
        num_labels: labels in the manifest; a ``label`` outside ``0..num_labels-1`` is a problem.
        check_sha: compare the stored ``sha256`` feature with the payload's (when both exist).
        decode_images: also decode each payload with Pillow.
        labels: records per label index (in range only), counted in place.
        add: called as ``add(what, record index, byte offset)`` for each problem found.
        limit: problems the caller keeps (the first, in record order); a check
            that finds them out of order holds no more than this many, and
            reports how many more it found to ``skip``. None: no limit.
        skip: called as ``skip(n)`` with the number of problems found past ``limit``.
        digests: when given, record ``i``'s stored ``sha256`` (64 hex digits) is
            kept as 32 bytes at ``digests[32 * i : 32 * i + 32]`` (zeros where a
            record has none, or lies past the buffer's end).
        group_by: when given, each record's ``path`` feature names its group,
            added to ``groups``; a path the pattern does not match is a problem.
        groups: the group keys found, added to in place.
    """

    def __init__(
        self,
        schema: Sequence[FeatureSpec],
        image_feature: str,
        *,
        num_labels: int,
        check_sha: bool,
        decode_images: bool,
        labels: list[int],
        add: Callable[[str, int, int], None],
        limit: int | None = None,
        skip: Callable[[int], None] | None = None,
        digests: bytearray | None = None,
        group_by: GroupBy | None = None,
        groups: set[str] | None = None,
    ) -> None:
        if limit is not None and (limit < 1 or skip is None):
            raise ValueError(f"limit must be >= 1 and come with skip, got {limit}")
        self.schema, self.image_feature = schema, image_feature
        self.plan = _Plan.build(schema, image_feature)
        has_image = _scalar(schema, image_feature, "bytes")
        self.check_sha = check_sha and has_image and _scalar(schema, "sha256", "bytes")
        self.decode_images = decode_images and has_image
        self.count_labels = _scalar(schema, "label", "int64")
        self.check_images = has_image and _scalar(schema, "path", "bytes")
        self.num_labels, self.labels, self.add = num_labels, labels, add
        self.limit, self.skip = limit, skip
        self.digests = digests if _scalar(schema, "sha256", "bytes") else None
        has_path = _scalar(schema, "path", "bytes")
        self.group_by = group_by if has_path and groups is not None else None
        self.groups: set[str] = groups if groups is not None else set()

    def reporting_to(self, add: Callable[[str, int, int], None]) -> RecordChecker:
        """The same checks, counting into the same ``labels``, with problems going to ``add``."""
        other = copy.copy(self)
        other.add = add
        return other

    def check(
        self, buf: bytes, view: memoryview, index: int, offset: int, start: int, end: int
    ) -> None:
        """Check the record whose data (CRC already verified) is ``buf[start:end]``."""
        checked = self.plan.check(buf, start, end)
        if checked is None:  # not the canonical layout: the general decoder decides, and says why
            slow = _check_slow(view[start:end], self.schema, self.image_feature)
            if isinstance(slow, str):
                self.add(slow, index, offset)
                return
            label, payload, stored, path = slow
        else:
            label, ps, pe, ss, se, ns, ne = checked
            payload, stored, path = view[ps:pe], buf[ss:se], buf[ns:ne]
        if self.count_labels:
            self.count_label(label, index, offset)
        if self.digests is not None:
            self.keep_digest(index, stored)
        if self.group_by is not None:
            self.keep_group(path, index, offset)
        if self.check_sha:
            self.compare_sha(hashlib.sha256(payload).hexdigest().encode(), stored, index, offset)
        if self.check_images:
            self.check_image(payload, path, index, offset)
        if self.decode_images:
            why = _undecodable(payload)
            if why is not None:
                self.add(
                    f"feature {self.image_feature!r} does not decode as an image: {why}",
                    index,
                    offset,
                )

    def keep_digest(self, index: int, stored: Any) -> None:
        """Keep record ``index``'s stored sha256 (hex) as 32 bytes, if it is one."""
        end = 32 * index + 32
        if self.digests is None or end > len(self.digests) or len(stored) != 64:
            return
        with contextlib.suppress(ValueError):  # not hex: compare_sha reports it
            self.digests[end - 32 : end] = bytes.fromhex(bytes(stored).decode("ascii"))

    def keep_group(self, path: Any, index: int, offset: int) -> None:
        """Add the group of record ``index``'s path to ``groups``."""
        if self.group_by is None:
            return
        name = bytes(path).decode("utf-8", "replace")
        key = self.group_by.key(name)
        if key is None:
            self.add(
                f"path {name!r}: expected a match of the manifest's group_by "
                f"'{self.group_by.pattern}', found none",
                index,
                offset,
            )
        else:
            self.groups.add(key)

    def count_label(self, label: int, index: int, offset: int) -> None:
        if 0 <= label < self.num_labels:
            self.labels[label] += 1
        else:
            self.add(
                f"label out of range: expected 0..{self.num_labels - 1} "
                f"({self.num_labels} labels), found {label}",
                index,
                offset,
            )

    def check_image(self, payload: Any, path: Any, index: int, offset: int) -> None:
        """A payload whose path names an image must start like a known image format.

        The writer's own rule (:mod:`tfshards.imageformat`), for shards from
        anywhere; a header costs nothing to look at, unlike ``decode_images``.
        """
        name = bytes(path).decode("utf-8", "replace")
        if claims_image(name) and image_format(payload[:HEAD_BYTES]) is None:
            self.add(
                f"feature {self.image_feature!r} of {name}: {not_an_image(bytes(payload[:8]))}",
                index,
                offset,
            )

    def compare_sha(self, digest: bytes, stored: Any, index: int, offset: int) -> None:
        if digest != stored:
            self.add(
                f"feature 'sha256' does not match the sha256 of feature "
                f"{self.image_feature!r}: expected {digest.decode()}, "
                f"found {bytes(stored).decode('ascii', 'backslashreplace')}",
                index,
                offset,
            )


def _frames(buf: bytes) -> Iterator[tuple[int, int, int, int, str | None]]:
    """``(index, offset, data start, data end, problem)`` of each record in ``buf``.

    :func:`tfshards.tfrecord.scan`'s checks without its per-record objects
    (~1 us less per record); from the first problem on, ``scan`` itself takes
    over, so problems are found and worded in one place. A framing problem
    has start -1 and ends the records.
    """
    view = memoryview(buf)
    size = len(buf)
    offset = index = 0
    header, footer, crc, mask = _HEADER.unpack_from, _FOOTER.unpack_from, crc32c.crc32c, tfr.mask
    while size - offset >= HEADER_BYTES + FOOTER_BYTES:
        length, length_crc = header(buf, offset)
        start = offset + HEADER_BYTES
        end = start + length
        if (
            end + FOOTER_BYTES > size
            or mask(crc(view[offset : offset + 8])) != length_crc
            or mask(crc(view[start:end])) != footer(buf, end)[0]
        ):
            break
        yield index, offset, start, end, None
        offset = end + FOOTER_BYTES
        index += 1
    if offset < size:
        for i, at, data, problem in tfr.scan(view[offset:]):
            start = -1 if data is None else offset + at + HEADER_BYTES
            yield index + i, offset + at, start, start + len(data or b""), problem


def _scalar(schema: Sequence[FeatureSpec], name: str, dtype: str) -> bool:
    return any(s.name == name and s.dtype == dtype and s.size == 1 for s in schema)


def _check_slow(
    data: memoryview, schema: Sequence[FeatureSpec], image_feature: str
) -> str | tuple[int, Any, Any, Any]:
    """The general path: a problem, or ``(label, payload, stored sha256, path)`` of a record."""
    try:
        found = outline(data, {spec.name for spec in schema})
    except (DecodeError, UnicodeDecodeError) as exc:
        return f"not a tf.train.Example: {exc}"
    problem = outline_problem(found, schema)
    if problem is not None:
        return problem

    def first(name: str, default: Any) -> Any:
        feature = found.get(name)
        return feature.first if feature is not None and feature.size == 1 else default

    return first("label", 0), first(image_feature, b""), first("sha256", b""), first("path", b"")


def _undecodable(payload: Any) -> str | None:
    """Why Pillow cannot decode ``payload``, or None when it can."""
    from PIL import Image  # only with --decode

    try:
        with Image.open(io.BytesIO(payload)) as img:
            img.load()
    # What Pillow raises for bad image bytes; anything else is a bug and propagates.
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


# ----------------------------------------------------------------------------- fast path
_HEADER = struct.Struct("<QI")  # TFRecord: length, masked crc32c of the length
_FOOTER = struct.Struct("<I")  # masked crc32c of the data
_TAG1 = 0x0A  # field 1, length-delimited: Example.features, map entry, key, each list
_KIND_TAG = {"bytes": 0x0A, "float": 0x12, "int64": 0x1A}  # Feature's oneof fields 1, 2, 3
_OTHER, _PAYLOAD, _STORED, _LABEL, _PATH = range(5)  # what a feature is to the record checks
_TOO_LONG = 1 << 64  # a length no record has, so every bounds check after it fails
_LONG_VARINT = re.compile(rb"[\x80-\xff]{10}")  # example.decode rejects varints over 10 bytes
_HIGH_BYTES = bytes(range(0x80, 0x100))


def _more(b: bytes, pos: int, x: int) -> tuple[int, int]:
    """Finish a varint whose first byte ``x`` (>= 0x80) ends just before ``pos``.

    Returns ``(value, next position)``, or :data:`_TOO_LONG` past 10 bytes.
    Callers read one-byte varints inline: a call costs more than the decoding.
    """
    result, shift = x & 0x7F, 7
    while shift < 70:
        x = b[pos]
        pos += 1
        result |= (x & 0x7F) << shift
        if x < 0x80:
            return result, pos
        shift += 7
    return _TOO_LONG, pos


@dataclass(frozen=True)
class _Plan:
    """The schema, laid out as :func:`tfshards.example.encode` writes it (keys sorted).

    ``specs`` holds per feature: the bytes that open its map entry's key
    field and its ``Feature`` tag (``0x0A len key 0x12``) and their length,
    its list kind tag, its size (-1: varies), its role in the record checks,
    and whether it is a single bytes value (the common case, unrolled).
    """

    specs: tuple[tuple[bytes, int, int, int, int, bool], ...]

    @classmethod
    def build(cls, schema: Sequence[FeatureSpec], image_feature: str) -> _Plan:
        roles = {(image_feature, "bytes"): _PAYLOAD, ("sha256", "bytes"): _STORED}
        roles[("label", "int64")] = _LABEL
        roles[("path", "bytes")] = _PATH
        specs = []
        for s in schema:
            key = s.name.encode()
            if len(key) >= 0x80:  # a two-byte key length: leave such rare schemas to decode
                return cls(())
            role = roles.get((s.name, s.dtype), _OTHER) if s.size == 1 else _OTHER
            head = bytes([_TAG1, len(key)]) + key + b"\x12"  # key field, then Feature's tag
            size = -1 if s.size is None else s.size
            scalar_bytes = size == 1 and s.dtype == "bytes"
            specs.append((key, (head, len(head), _KIND_TAG[s.dtype], size, role, scalar_bytes)))
        return cls(tuple(spec for _, spec in sorted(specs)))

    def check(
        self, b: bytes, pos: int, end: int
    ) -> tuple[int, int, int, int, int, int, int] | None:
        """``(label, payload start, end, sha256 start, end, path start, end)`` of ``b[pos:end]``.

        Returns them only for an Example in the canonical layout that conforms
        to the schema; None for anything else (the general path then decides,
        and words any problem as :func:`conformance_problem` does). Each length
        is checked against its enclosing end before use, so bytes past ``end``
        never count.
        """
        if not self.specs:
            return None
        label = ps = pe = ss = se = ns = ne = first = first_end = 0
        try:
            if b[pos] != _TAG1:
                return None
            n = b[pos + 1]
            pos += 2
            if n > 0x7F:
                n, pos = _more(b, pos, n)
            if pos + n != end:
                return None
            for head, head_len, tag, size, role, scalar_bytes in self.specs:
                if b[pos] != _TAG1:
                    return None
                n = b[pos + 1]
                pos += 2
                if n > 0x7F:
                    n, pos = _more(b, pos, n)
                entry_end = pos + n
                if entry_end > end or not b.startswith(head, pos, entry_end):
                    return None
                pos += head_len  # key field and the Feature's tag; now the Feature's length
                n = b[pos]
                pos += 1
                if n > 0x7F:
                    n, pos = _more(b, pos, n)
                if pos + n != entry_end or not n or b[pos] != tag:
                    return None  # (an empty Feature, or a list kind the schema does not say)
                n = b[pos + 1]
                pos += 2
                if n > 0x7F:
                    n, pos = _more(b, pos, n)
                if pos + n != entry_end:
                    return None
                count = 0
                if scalar_bytes:  # the common case, unrolled: exactly one {1: bytes}
                    if b[pos] != _TAG1:
                        return None
                    n = b[pos + 1]
                    pos += 2
                    if n > 0x7F:
                        n, pos = _more(b, pos, n)
                    if pos + n != entry_end:
                        return None
                    if role == _PAYLOAD:
                        ps, pe = pos, entry_end
                    elif role == _STORED:
                        ss, se = pos, entry_end
                    elif role == _PATH:
                        ns, ne = pos, entry_end
                    pos = entry_end
                    continue
                if tag == _TAG1:  # BytesList: repeated {1: bytes}
                    while pos < entry_end:
                        if b[pos] != _TAG1:
                            return None
                        n = b[pos + 1]
                        pos += 2
                        if n > 0x7F:
                            n, pos = _more(b, pos, n)
                        if not count:
                            first, first_end = pos, pos + n
                        pos += n
                        count += 1
                    if pos != entry_end:
                        return None
                    if role == _PAYLOAD:
                        ps, pe = first, first_end
                    elif role == _STORED:
                        ss, se = first, first_end
                    elif role == _PATH:
                        ns, ne = first, first_end
                elif pos < entry_end:  # FloatList or Int64List: {1: packed}
                    if b[pos] != _TAG1:
                        return None
                    n = b[pos + 1]
                    pos += 2
                    if n > 0x7F:
                        n, pos = _more(b, pos, n)
                    if pos + n != entry_end:
                        return None
                    if tag == 0x12:
                        if n % 4:
                            return None
                        count = n // 4
                    else:
                        count = len(b[pos:entry_end].translate(None, _HIGH_BYTES))
                        # Some varints take several bytes: the last must end, none run long.
                        if count < n and (
                            b[entry_end - 1] > 0x7F or _LONG_VARINT.search(b, pos, entry_end)
                        ):
                            return None
                        if role == _LABEL:
                            label = b[pos]
                            if label > 0x7F:
                                label = _more(b, pos + 1, label)[0]
                            if label >= 1 << 63:
                                label -= 1 << 64
                if size >= 0 and count != size:
                    return None
                pos = entry_end
        except IndexError:
            return None
        if pos != end:
            return None  # features the schema does not name
        return label, ps, pe, ss, se, ns, ne
