"""Each validation rule on parsed fields, and each set rule on a small shard set."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import zlib
from typing import Any

import fsspec
import pytest

from tfshards.format.exampleparser import Outline
from tfshards.format.schema import FeatureSpec
from tfshards.shardset import grouping
from tfshards.shardset.grouping import GroupBy
from tfshards.shardset.manifest import Manifest, ShardInfo
from tfshards.validation import rules
from tfshards.validation.duplicates import Duplicate, Duplicates

BASE = (
    FeatureSpec("image", "bytes"),
    FeatureSpec("label", "int64"),
    FeatureSpec("path", "bytes"),
    FeatureSpec("sha256", "bytes"),
)
SHARD = rules.Shard(BASE, "image", num_labels=3)
JPEG = b"\xff\xd8\xff\xe0" + bytes(30)
TEXT = b"just some notes\n"


def _record(payload: bytes = JPEG, label: int = 1, path: str = "a/1.jpg", **extra: Any):
    fields = {
        "image": Outline("bytes", 1, memoryview(payload)),
        "label": Outline("int64", 1, label),
        "path": Outline("bytes", 1, memoryview(path.encode())),
        "sha256": Outline("bytes", 1, hashlib.sha256(payload).hexdigest().encode()),
        **extra,
    }
    return rules.Record(7, 1234, fields)


def _problems(record: rules.Record, shard: rules.Shard = SHARD) -> list[str]:
    found = [rule(shard, record) for rule in rules.RECORD_RULES]
    return [p for p in found if p is not None]


def test_a_good_record_breaks_no_rule():
    assert _problems(_record()) == []


def test_a_missing_feature_breaks_conformance():
    record = _record()
    fields = {k: v for k, v in record.fields.items() if k != "label"}
    assert rules.conforms_to_schema(SHARD, record._replace(fields=fields)) == (
        "feature 'label' missing"
    )


@pytest.mark.parametrize("label", [-1, 3, 1 << 40])
def test_a_label_outside_the_manifest_labels_is_a_problem(label):
    assert rules.label_in_range(SHARD, _record(label=label)) == (
        f"label out of range: expected 0..2 (3 labels), found {label}"
    )


def test_a_stored_sha256_of_other_bytes_is_a_problem_unless_a_transform_wrote_the_set():
    record = _record()
    fields = {**record.fields, "sha256": Outline("bytes", 1, b"0" * 64)}
    damaged = record._replace(fields=fields)
    assert "does not match the sha256 of feature 'image'" in str(
        rules.sha256_matches_payload(SHARD, damaged)
    )
    transformed = rules.Shard(BASE, "image", 3, check_sha=False)
    assert rules.sha256_matches_payload(transformed, damaged) is None


def test_a_payload_that_is_no_known_image_under_an_image_name_is_a_problem():
    assert rules.payload_is_whole_image(SHARD, _record(TEXT, path="b/notes.jpg")) == (
        "feature 'image' of b/notes.jpg: expected an image (JPEG, PNG, GIF, BMP or WebP) "
        "as its name says, found bytes b'just som'"
    )
    assert rules.payload_is_whole_image(SHARD, _record(TEXT, path="b/notes.txt")) is None


def test_the_image_rule_holds_for_sets_written_with_a_transform():
    """The writer refused the file before any transform; a transform that put other bytes
    in the payload feature under an image name made records the loader cannot decode."""
    transformed = rules.Shard(BASE, "image", 3, check_sha=False)
    assert rules.payload_is_whole_image(transformed, _record(TEXT, path="b/x.png")) is not None
    assert rules.payload_is_whole_image(transformed, _record(JPEG, path="b/x.png")) is None


def test_the_image_rule_needs_the_path_feature():
    shard = rules.Shard(BASE[:2], "image", 3)
    assert rules.payload_is_whole_image(shard, _record(TEXT, path="b/notes.jpg")) is None


def test_decoding_is_a_rule_only_when_asked_for():
    assert rules.payload_decodes(SHARD, _record(JPEG)) is None
    decoding = rules.Shard(BASE, "image", 3, decode_images=True)
    assert "does not decode as an image" in str(rules.payload_decodes(decoding, _record(JPEG)))


def test_tensorflows_refusal_is_said_in_one_line_without_its_op_names():
    decoding = rules.Shard(BASE, "image", 3, decode_images=True)
    line = str(rules.payload_decodes(decoding, _record(b"\xff\xd8\xff plain text")))
    assert line.startswith("feature 'image' of a/1.jpg does not decode as an image: "), line
    assert "\n" not in line and "{{" not in line and "[Op:" not in line, line


def _png_chunk(kind: bytes, data: bytes, crc: int | None = None) -> bytes:
    crc = zlib.crc32(kind + data) if crc is None else crc
    return len(data).to_bytes(4, "big") + kind + data + crc.to_bytes(4, "big")


def test_the_decode_rule_is_tensorflows_where_pillow_disagrees():
    """Training decodes with TensorFlow: a text chunk with a bad CRC trains fine (Pillow
    refused it), a bad IEND CRC stops training (Pillow decoded it)."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), (9, 99, 199)).save(out, "PNG")
    png = out.getvalue()
    head = 8 + 25  # the signature and IHDR
    bad_text = png[:head] + _png_chunk(b"tEXt", b"Comment\0hi", crc=0) + png[head:]
    bad_end = png[:-4] + bytes(4)
    decoding = rules.Shard(BASE, "image", 3, decode_images=True)
    assert rules.payload_decodes(decoding, _record(bad_text, path="a/t.png")) is None
    line = rules.payload_decodes(decoding, _record(bad_end, path="a/e.png"))
    assert str(line).startswith("feature 'image' of a/e.png does not decode as an image: ")


def _manifest(records: int = 4, listed: int = 4) -> Manifest:
    shards = (ShardInfo("s-00000-of-00001.tfrecord", records, 100, "0" * 64),)
    return Manifest("memory://set/v1", "v1", {}, BASE, ("a", "b"), "none", shards, listed=listed)


def _set(manifest: Manifest, found: int, dups: Duplicates = Duplicates(), **kw: Any):
    fs = fsspec.filesystem("memory")
    return rules.ShardSet(manifest, "data/manifest.json", fs, "/set/v1", found, dups, **kw)


def test_a_sound_set_breaks_no_set_rule():
    found = rules.apply_set_rules(_set(_manifest(), 4))
    assert found == rules.Findings([], 0)


def test_record_counts_that_disagree_are_set_problems_naming_the_manifest():
    found = rules.apply_set_rules(_set(_manifest(records=4, listed=5), 3))
    assert [str(p) for p in found.problems] == [
        "manifest.json: total record count mismatch: expected 4, found 3",
        "manifest.json: inputs do not add up: expected 5 listed = records + rejected, found 4 + 0",
    ]
    assert found.total == 2


def test_leakage_shows_the_example_pairs_and_counts_every_payload_across_the_split():
    pair = Duplicate("ab" * 32, ("s0", 1), ("s1", 2), across_splits=True)
    dups = Duplicates(records=5, groups=5, across_splits=5, examples=(pair,))
    assert rules.no_leakage_across_splits(_set(_manifest(), 4, dups)) == rules.Findings([], 0)
    found = rules.no_leakage_across_splits(_set(_manifest(), 4, dups, fail_on_leakage=True))
    assert [p.where for p in found.problems] == ["s0"]
    assert found.problems[0].what.endswith("(fail_on_leakage is true)")
    assert found.total == 5


def test_a_new_set_rule_is_one_function():
    def at_least_ten_records(shards: rules.ShardSet) -> rules.Findings:
        n = shards.records
        problems = [] if n >= 10 else [rules.Problem("manifest.json", f"only {n} records")]
        return rules.Findings(problems, len(problems))

    found = rules.apply_set_rules(_set(_manifest(), 4), (*rules.SET_RULES, at_least_ten_records))
    assert [p.what for p in found.problems] == ["only 4 records"]


def test_a_path_the_group_by_pattern_does_not_match_is_a_problem():
    shard = rules.Shard(BASE, "image", 3, group_by=GroupBy(r"^(subject\d+)/"))
    assert rules.path_names_a_group(shard, _record(path="subject7/a.jpg")) is None
    assert rules.path_names_a_group(shard, _record(path="other/a.jpg")) == (
        "path 'other/a.jpg': expected a match of the manifest's group_by "
        "'^(subject\\d+)/', found no match"
    )
    assert rules.path_names_a_group(SHARD, _record(path="other/a.jpg")) is None


def test_a_path_matched_without_the_capture_group_says_so():
    shard = rules.Shard(BASE, "image", 3, group_by=GroupBy(r"^[^/]+/(s\d+_)?"))
    assert rules.path_names_a_group(shard, _record(path="cat/s1_a.jpg")) is None
    assert rules.path_names_a_group(shard, _record(path="cat/a.jpg")) == (
        "path 'cat/a.jpg': expected a match of the manifest's group_by "
        "'^[^/]+/(s\\d+_)?', matched 'cat/', but capture group 1 did not participate"
    )


def test_a_group_in_two_shards_is_one_set_problem_counting_every_such_group():
    manifest = _manifest()
    manifest = Manifest(**{**manifest.__dict__, "params": {"group_by": "^(s\\d)/"}})
    spread = grouping.spread(["a", "b"], [["s1", "s2"], ["s2", "s3"]])
    found = rules.groups_in_one_shard(_set(manifest, 4, groups=spread))
    assert [p.what for p in found.problems] == [
        "groups across shards: expected 0 under group_by '^(s\\d)/', "
        "found 1 (group 's2' is in a and b)"
    ]
    assert rules.groups_in_one_shard(_set(_manifest(), 4)) == rules.Findings([], 0)


def test_a_fingerprint_that_is_not_its_folders_name_is_a_problem():
    """A hand edit of the manifest's fingerprint (the version's name) is found."""
    renamed = dataclasses.replace(_manifest(), fingerprint="0000000000000000")
    assert [str(p) for p in rules.named_like_its_folder(_set(renamed, 4)).problems] == [
        "manifest.json: expected the fingerprint v1 (its version folder's name), found "
        "'0000000000000000'"
    ]
    assert rules.named_like_its_folder(_set(_manifest(), 4)).problems == []


def test_an_animated_webp_is_refused_without_decoding_it():
    """TensorFlow 2.21 aborts the process decoding one: the decode rule leaves it to the
    image rule, which names it from its header."""
    from PIL import Image

    frames = [Image.new("RGB", (8, 8), (60 * i, 0, 0)) for i in range(3)]
    out = io.BytesIO()
    frames[0].save(out, "WEBP", save_all=True, append_images=frames[1:])
    record = _record(out.getvalue(), path="a/anim.webp")
    decoding = rules.Shard(BASE, "image", 3, decode_images=True)
    assert rules.payload_decodes(decoding, record) is None  # the process lives on
    assert "found an animated WebP" in str(rules.payload_is_whole_image(decoding, record))
