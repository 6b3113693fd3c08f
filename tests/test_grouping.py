"""Group keys from paths, group ids in bounded memory, and how groups lie across shards."""

from __future__ import annotations

import re

import pytest

from tfshards.errors import ConfigError, InputError
from tfshards.writing.grouping import GroupBy, group_ids, spread


def test_first_capture_group_names_the_group():
    assert GroupBy(r"^([^/]+/[^_]+)_").key("cat/s01_0003.jpg") == "cat/s01"


def test_whole_match_names_the_group_without_a_capture_group():
    assert GroupBy(r"video\d+").key("cat/video12/frame_0001.jpg") == "video12"


def test_a_path_the_pattern_misses_has_no_group():
    assert GroupBy(r"^subject_(\d+)").key("cat/img.jpg") is None


@pytest.mark.parametrize("value", [None, "", "  ", "none", "None"])
def test_none_and_empty_mean_no_grouping(value):
    assert GroupBy.parse(value) is None


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("([a-z", "group_by: '([a-z' is not a valid regex"),
        ("column:subject", "index-file columns are not supported yet"),
    ],
)
def test_bad_patterns_are_config_errors(pattern, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        GroupBy(pattern)


def test_group_ids_number_sorted_keys_whatever_order_paths_come_in():
    ids, count = group_ids(GroupBy(r"^[^/]+/([^_]+)_"), ["a/z_1", "a/m_1", "b/z_2", "b/a_1"], "r")
    assert (list(ids), count) == ([2, 1, 2, 0], 3)


def test_a_path_the_pattern_misses_is_one_line_naming_file_and_pattern():
    paths = ["cat/s01_0.jpg", "cat/stray.jpg"]
    with pytest.raises(InputError) as caught:
        group_ids(GroupBy(r"^[^/]+/(s\d+)_"), paths, "data/raw")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("data/raw/cat/stray.jpg: expected its path 'cat/stray.jpg' ")
    assert r"to match group_by '^[^/]+/(s\d+)_', found no match: widen the pattern" in message
    assert caught.value.path == "data/raw/cat/stray.jpg"  # type: ignore[attr-defined]


def test_spread_counts_groups_found_in_more_than_one_shard():
    found = spread(["s0", "s1", "s2"], [("a", "b"), ("c",), ("b", "d", "e")])
    assert (found.groups, found.spanning, found.example) == (5, 1, ("b", "s0", "s2"))
    assert found.metrics() == {"groups": 5, "spanning_shards": 1}


def test_spread_of_whole_groups_is_zero():
    assert spread(["s0", "s1"], [("a", "b"), ("c",)]).metrics() == {
        "groups": 3,
        "spanning_shards": 0,
    }
