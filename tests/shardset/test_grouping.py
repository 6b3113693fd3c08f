"""Group keys from paths, group ids in bounded memory, and how groups lie across shards."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfshards.cli import app
from tfshards.errors import ConfigError, InputError
from tfshards.project.sample import write_synthetic
from tfshards.shardset.grouping import MATCH_SECONDS, GroupBy, group_ids, spread

# Nested quantifiers over a name of 40 commas, with the P the pattern needs (else the
# regex module gives up at once): C(40, 11) = 2.3e9 splits to try. Python's re took
# 2.1 s at 24 commas on a 2-core VM, C(40, 11) / C(24, 11) = 940 times fewer.
BACKTRACKS = r"^[^/]+/(.*?,){11}P"
CRAFTED = "00/P" + "1," * 40 + ".jpg"


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


def test_an_optional_group_that_took_no_part_is_reported_as_such_not_as_no_match():
    group_by = GroupBy(r"^[^/]+/(s\d+)?")
    assert group_by.key("cat/s01_0.jpg") == "s01" and group_by.key("cat/stray.jpg") is None
    with pytest.raises(InputError) as caught:
        group_ids(group_by, ["cat/s01_0.jpg", "cat/stray.jpg"], "data/raw")
    assert "matched 'cat/', but capture group 1 did not participate: widen" in str(caught.value)
    assert "found no match" not in str(caught.value)


def test_a_backtracking_pattern_on_a_crafted_name_stops_at_the_time_limit():
    started = time.monotonic()
    with pytest.raises(InputError) as caught:
        group_ids(GroupBy(BACKTRACKS), ["00/" + "1," * 11 + "P.jpg", CRAFTED], "data/raw")
    took = time.monotonic() - started
    assert MATCH_SECONDS <= took < MATCH_SECONDS + 3, took
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"data/raw/{CRAFTED}: group_by '{BACKTRACKS}' took over 1 s ")
    assert caught.value.path == f"data/raw/{CRAFTED}"  # type: ignore[attr-defined]


def test_cli_write_over_a_crafted_name_fails_in_one_line_within_the_time_limit(tmp_path: Path):
    raw = tmp_path / "raw"
    write_synthetic(str(raw), 4, 8, classes=1, workers=1)
    for i, image in enumerate(sorted(raw.glob("00/*.jpg"))):  # the others match, listed first
        image.rename(raw / CRAFTED if i == 0 else image.with_name(f"{'1,' * 11}P{i}.jpg"))
    runner = CliRunner()
    listing, out = tmp_path / "listing", tmp_path / "shards"
    assert runner.invoke(app, ["list", str(raw), "--out", str(listing)]).exit_code == 0
    started = time.monotonic()
    result = runner.invoke(
        app,
        [
            *("write", str(listing), "--out", str(out), "--manifest", str(tmp_path / "m.json")),
            *("--group-by", BACKTRACKS, "--no-progress"),
        ],
    )
    assert time.monotonic() - started < MATCH_SECONDS + 10
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "took over 1 s to match" in lines[0], result.output
    assert not out.exists()


def test_spread_counts_groups_found_in_more_than_one_shard():
    found = spread(["s0", "s1", "s2"], [("a", "b"), ("c",), ("b", "d", "e")])
    assert (found.groups, found.spanning, found.example) == (5, 1, ("b", "s0", "s2"))
    assert found.metrics() == {"groups": 5, "spanning_shards": 1}


def test_spread_of_whole_groups_is_zero():
    assert spread(["s0", "s1"], [("a", "b"), ("c",)]).metrics() == {
        "groups": 3,
        "spanning_shards": 0,
    }
