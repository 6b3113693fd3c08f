"""The decode plan: scaled JPEG decode only for sets of images at least twice the target."""

from __future__ import annotations

import pytest

from tfshards.reading.decodeplan import DecodePlan, plan


@pytest.mark.parametrize(
    ("source", "target", "scaled"),
    [
        ((512, 512), (224, 224), True),  # 2.3x: decoded at 1/2
        ((448, 448), (224, 224), True),  # exactly 2x
        ((447, 448), (224, 224), False),  # one side short of 2x: the switch would pick 1/1
        ((224, 224), (224, 224), False),
        ((96, 96), (96, 96), False),
        ((96, 96), (32, 32), True),
        ((1024, 300), (224, 224), False),  # the short side decides
        ((512, 512), None, False),  # not resized: decoded as stored
        (None, (224, 224), False),  # size unknown: nothing decoded yet
    ],
)
def test_scaled_decode_only_where_the_source_is_twice_the_target(source, target, scaled):
    assert plan(source=source, target=target).scaled is scaled


def test_scaled_decode_off_when_asked():
    assert not plan(source=(512, 512), target=(64, 64), scaled_decode=False).scaled


@pytest.mark.parametrize(
    ("source", "target", "per_record"),
    [
        ((32, 32), None, False),  # tiny images: a batch at a time
        ((64, 64), (64, 64), False),  # decodeplan.BATCHED_UP_TO pixels exactly
        ((16, 256), (32, 32), False),  # the pixels decide, not a side
        ((64, 65), (64, 64), True),  # one pixel row more: record by record
        ((96, 96), (96, 96), True),
        ((512, 512), (224, 224), True),
        ((64, 64), (32, 32), True),  # scaled decode: its per-image choice costs most in a batch
        (None, (32, 32), True),  # size unknown
    ],
)
def test_a_batch_at_a_time_for_tiny_images_record_by_record_above(source, target, per_record):
    assert plan(source=source, target=target).per_record is per_record


@pytest.mark.parametrize("source", [(32, 32), (96, 96), (512, 512)])
def test_the_path_asked_for_wins(source):
    assert plan(source=source, target=None, per_record=True).per_record
    assert not plan(source=source, target=(32, 32), per_record=False).per_record


def test_the_plan_is_a_value():
    assert plan(source=(512, 512), target=(224, 224)) == DecodePlan(per_record=True, scaled=True)


@pytest.mark.parametrize(
    ("formats", "jpeg"),
    [
        ({"JPEG": 20}, True),
        ({"JPEG": 20, "PNG": 0}, True),  # a format counted zero times is not there
        ({"JPEG": 19, "PNG": 1}, False),  # one PNG: every image's format is sniffed
        ({"PNG": 20}, False),
        ({"JPEG": 0}, False),  # no images counted
        ({}, False),
        (None, False),  # a version without statistics
    ],
)
def test_decode_jpeg_only_where_the_statistics_count_nothing_but_jpegs(formats, jpeg):
    assert plan(source=(96, 96), target=None, formats=formats).jpeg is jpeg
