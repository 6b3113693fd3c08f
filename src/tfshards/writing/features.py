"""The record source of transformed or resized files: features encoded per file.

Each file is fetched whole and checked against its listing, then becomes the
base features (payload, label, path, sha256), the index file's extra columns
(:mod:`tfshards.format.columns`: a feature each), plus what the user's transform
(:mod:`tfshards.run.transform`) returns, the payload resized
(:mod:`tfshards.writing.resize`) when asked. The shard's schema grows as
the transform's features are seen (:func:`base_specs`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfshards import storage
from tfshards.errors import InputError, TransformError, TransformOutputError
from tfshards.format.example import encode
from tfshards.format.exif import UPRIGHT
from tfshards.format.imageformat import claims_image, image_problem
from tfshards.format.recordbuffer import RecordBuffer
from tfshards.format.schema import FeatureSpec, Values, merge_specs, normalize
from tfshards.format.tfrecord import frame
from tfshards.format.wire import Dtype
from tfshards.listing.contenthash import expected_sha256
from tfshards.listing.entry import Entry
from tfshards.run import transform as transforms
from tfshards.shardset.resize import Resize
from tfshards.writing.fileproblem import check_md5, content_error, file_problem, size_error
from tfshards.writing.orientation import orient
from tfshards.writing.resize import resize_image
from tfshards.writing.sources import Problems

Features = dict[str, tuple[Dtype, Values]]


def base_specs(image_feature: str) -> dict[str, FeatureSpec]:
    """The features every record has, by name."""
    return {
        image_feature: FeatureSpec(image_feature, "bytes", ()),
        "label": FeatureSpec("label", "int64", ()),
        "path": FeatureSpec("path", "bytes", ()),
        "sha256": FeatureSpec("sha256", "bytes", ()),
    }


@dataclass
class FeatureKeys:
    """The features a shard's first good file got from the transform, and that file."""

    first: str = ""
    keys: frozenset[str] | None = None

    def check(self, rel: str, spec: str, keys: Collection[str]) -> None:
        """Every file must get the features the first one got.

        A feature some records lack would make the schema a union that the
        records do not follow; the writer refuses it here, naming the file.
        """
        if self.keys is None:
            self.first, self.keys = rel, frozenset(keys)
        elif set(keys) != self.keys:
            raise TransformOutputError(
                f"{rel}: transform {spec}: " + keys_differ(sorted(self.keys), self.first, keys),
                path=rel,
            )


@dataclass
class FeatureFiles:
    """Files read whole and encoded as Examples: with a transform, a resize, or both.

    ``specs`` is the shard's schema, updated in place with each feature the
    transform returns.
    """

    fs: Any
    root: str
    image_feature: str
    transform: str | None
    fn: transforms.Transform | None
    resize: Resize | None
    specs: dict[str, FeatureSpec]
    exif: str = "ignore"  # tfshards.writing.orientation's mode
    keys: FeatureKeys = field(default_factory=FeatureKeys)
    rotated: int = 0  # files framed with an EXIF orientation of 2..8

    def frame(self, buffer: RecordBuffer, entries: Sequence[Entry]) -> Problems:
        for entry in entries:
            try:
                buffer.append(frame(encode(self.features(entry))[0]))
            except (OSError, InputError) as exc:
                yield entry, exc

    def features(self, entry: Entry) -> Features:
        """One file's features, checked against its listed size and content token."""
        rel, listed_size, label, token, values = entry
        data = storage.read_bytes(self.fs, storage.join(self.root, rel), size_hint=listed_size)
        if len(data) != listed_size or not data:
            raise size_error(rel, listed_size, len(data))
        check_md5(data, token, rel)
        sha = hashlib.sha256(data)
        want = expected_sha256(token)
        if want is not None and sha.digest() != want:
            local_path = storage.join(self.root, rel) if storage.is_local(self.fs) else None
            raise content_error(rel, want, sha.hexdigest(), local_path)
        if claims_image(rel) and (problem := image_problem(data)) is not None:
            raise file_problem(problem, rel, listed_size)
        payload = data
        if self.exif != "ignore":  # upright under apply; the sha256 is then its payload's
            payload, turn = orient(data, self.exif, rel)
            self.rotated += turn != UPRIGHT
            sha = sha if payload is data else hashlib.sha256(payload)
        if self.resize is not None:  # the record holds the resized image; sha256 is its payload's
            try:
                payload = resize_image(payload, self.resize)
            except InputError as exc:
                raise InputError(str(exc), path=rel) from None
            sha = hashlib.sha256(payload)
        features: Features = {
            self.image_feature: ("bytes", [payload]),
            "label": ("int64", [label]),
            "path": ("bytes", [rel.encode()]),
            "sha256": ("bytes", [sha.hexdigest().encode()]),
        }
        for name, value in (values or {}).items():
            spec = self.specs[name]
            features[name] = (spec.dtype, [value] if spec.shape == () else value)
        if self.fn is not None and self.transform is not None:
            added = self._transformed(self.fn, self.transform, rel, data, label)
            for name in sorted(set(added) & set(values or {})):
                raise TransformOutputError(
                    f"{rel}: transform {self.transform}: expected features other than the "
                    f"index columns, found {name!r}",
                    path=rel,
                )
            features.update(added)
        return features

    def _transformed(
        self, fn: transforms.Transform, spec: str, rel: str, data: bytes, label: int
    ) -> Features:
        """What the transform adds for one file; its specs merged into the shard's schema."""
        out = transforms.apply(fn, spec, rel, data, label)
        added = {key: normalize(key, value) for key, value in out.items()}
        self.keys.check(rel, spec, added.keys())
        features: Features = {}
        for key, (dtype, values, shape) in added.items():
            seen = FeatureSpec(key, dtype, shape)
            try:
                self.specs[key] = merge_specs(self.specs[key], seen) if key in self.specs else seen
            except TransformError as exc:
                raise TransformOutputError(f"{rel}: {exc}", path=rel) from exc
            features[key] = (dtype, values)
        return features


def keys_differ(expected: Sequence[str], first: str, found: Collection[str]) -> str:
    """``expected the features [...] that FIRST returned, found 'x' missing, 'y' extra``."""
    missing = [f"{k!r} missing" for k in sorted(set(expected) - set(found))]
    extra = [f"{k!r} extra" for k in sorted(set(found) - set(expected))]
    return (
        f"expected the features {list(expected)} that {first} returned, "
        f"found {', '.join(missing + extra)}"
    )
