"""labelmap.resolve: a version's label map from the listing, the pinned map and the previous."""

from __future__ import annotations

import pytest

from tfshards.errors import ConfigError
from tfshards.writing.labelmap import gap_ids, resolve

TEN = tuple("abcdefghij")
NUMBERS = tuple(str(n) for n in range(26))


def _refused(*args) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        resolve(*args)
    assert "\n" not in str(caught.value)
    return caught.value


def test_a_new_label_is_appended_to_the_previous_map():
    listed = sorted((*TEN, "aardvark"))  # sorts first: the listing's own ids shift by one
    assert resolve(listed, None, TEN, False) == (*TEN, "aardvark")


def test_a_removed_label_keeps_its_id_and_it_is_never_reused():
    gone = resolve([n for n in TEN if n != "c"], None, TEN, False)
    assert gone == TEN  # "c" keeps id 2 with no records
    later = resolve([*(n for n in TEN if n != "c"), "k"], None, gone, False)
    assert later == (*TEN, "k") and later.index("k") == 10


def test_new_labels_append_in_sorted_order_and_relabel_changes_nothing():
    assert resolve(["b", "z", "y", "a"], None, ("b", "a"), True) == ("b", "a", "y", "z")
    assert resolve(["a", "b"], None, ("b", "a"), False) == ("b", "a")


def test_without_a_map_names_sort_as_the_listing_does():
    assert resolve(["dog", "cat", "bird"], None, None, False) == ("bird", "cat", "dog")


def test_numeric_folders_get_their_numbers():
    listed = sorted(NUMBERS)  # 0, 1, 10, 11, ... as the listing orders them
    assert resolve(listed, None, None, False) == NUMBERS
    assert resolve(["3", "0", "1"], None, None, False) == ("0", "1", "2", "3")  # "2": no records


@pytest.mark.parametrize(
    "listed",
    [["0", "1", "cat"], ["-1", "0", "1"], ["0", "1.0"], ["007", "cat"], ["٣", "0"]],
)
def test_names_that_are_not_all_decimal_numbers_sort_as_names(listed):
    assert resolve(listed, None, None, False) == tuple(sorted(listed))


def test_zero_padded_numbers_are_their_numbers_and_keep_their_spelling():
    assert resolve(["00", "01", "02", "10"], None, None, False) == (
        "00", "01", "02", "3", "4", "5", "6", "7", "8", "9", "10",
    )  # fmt: skip
    assert resolve(["02", "00", "01"], None, None, False) == ("00", "01", "02")


def test_two_names_of_one_number_are_refused_with_how_to_pin():
    error = _refused(["000", "001", "007", "1"], None, None, False)
    assert str(error).startswith("labels: folder names '001' and '1' are the same number")
    assert "write.labels in params.yaml or --labels" in str(error)
    assert str(error).endswith("e.g. write.labels: 1,000,001,007")
    assert (error.option, error.param) == ("labels", "write.labels")


@pytest.mark.parametrize(
    ("listed", "said"),
    [(["0", "1", "99999999"], "run up to 99999999, a map of 100000000 ids for 3 labels"),
     ([str(n) for n in range(9_999)] + ["100000"], "a map of 100001 ids for 10000 labels"),
     (["0", "40"], "run up to 40, a map of 41 ids for 2 labels")],
)  # fmt: skip
def test_a_map_far_larger_than_the_labels_is_refused(listed, said):
    error = _refused(listed, None, None, False)
    assert said in str(error) and "pin the label map with write.labels" in str(error)


def test_the_largest_numeric_map_allowed():
    assert len(resolve(["0", "29"], None, None, False)) == 30  # 10 * 2 + 10


def test_a_numeric_previous_map_grows_to_the_new_number():
    previous = tuple(str(n) for n in range(10))
    assert resolve([*previous, "12"], None, previous, False) == (*previous, "10", "11", "12")
    grown = resolve(["0", "12", "cat", "ant"], None, previous, False)
    assert grown == (*previous, "10", "11", "12", "ant", "cat")
    assert resolve([*previous, "cat"], None, previous, False) == (*previous, "cat")


def test_a_numeric_previous_map_grows_by_number_and_refuses_huge_numbers():
    previous = ("0", "1")
    assert resolve(["0", "02"], None, previous, False) == ("0", "1", "02")
    assert "folder '01' has the number of the previous version's label '1'" in str(
        _refused(["0", "01"], None, previous, False)
    )
    assert "run up to 99999" in str(_refused(["0", "99999"], None, previous, False))
    assert resolve(["0", "02", "x"], None, previous, False) == ("0", "1", "02", "x")


def test_a_previous_map_in_string_order_keeps_its_ids():
    previous = ("0", "1", "10", "2")  # written before numbers mapped to themselves
    assert resolve(["0", "1", "10", "2", "3"], None, previous, False) == (*previous, "3")


def test_a_pinned_map_that_swaps_previous_ids_needs_relabel():
    pinned = ("b", "a", *TEN[2:])
    error = _refused(TEN, pinned, TEN, False)
    message = str(error)
    assert message.startswith("labels: write.labels moves label 'a' from id 0 in the previous ")
    assert "version to id 1; ids must not change" in message
    assert "a model trained on the old ids reads the new ones wrong" in message
    assert message.endswith("--relabel (params.yaml write.relabel: true)")
    assert (error.option, error.param) == ("relabel", "write.relabel")
    assert resolve(TEN, pinned, TEN, True) == pinned


def test_a_pinned_map_that_drops_a_previous_label_needs_relabel():
    message = str(_refused(TEN[:9], TEN[:9], TEN, False))
    assert "moves label 'j' from id 9 in the previous version to no id" in message
    assert resolve(TEN[:9], TEN[:9], TEN, True) == TEN[:9]


def test_a_pinned_map_that_appends_needs_no_relabel():
    assert resolve([*TEN, "k"], (*TEN, "k"), TEN, False) == (*TEN, "k")
    assert resolve(["a"], TEN, None, False) == TEN


def test_a_listed_label_missing_from_the_pinned_map_is_refused_even_with_relabel():
    message = str(_refused([*TEN, "k"], TEN, TEN, True))
    assert "'k'" in message and "append them to write.labels" in message


def test_a_pinned_numeric_map_is_taken_as_given():
    assert resolve(["0", "7"], ("7", "0"), None, False) == ("7", "0")


def test_renamed_number_folders_are_refused_saying_how_to_rename_the_labels():
    """00, 01 renamed 0, 1: the pin hint named old and new together (0,1,00,01) and
    suggested --previous none, which keeps the label ids all the same."""
    error = _refused(["0", "1"], None, ["00", "01"], False)
    assert str(error) == (
        "labels: folder '0' has the number of the previous version's label '00' (renamed "
        "folders?), so neither can be its id; to rename the labels, pin this map, which "
        "keeps every other label's id: --labels 0,1 --relabel (params.yaml write.labels and "
        "write.relabel: true)"
    )
    assert resolve(["0", "1"], ["0", "1"], ["00", "01"], True) == ("0", "1")


def test_the_map_the_renumber_hint_pins_keeps_every_other_id():
    """00-04 then 12 gave the placeholders 5-11; a folder 05 then collided with '5', and
    the hint pinned 00,...,04,05,12: label 12 from id 12 to 6, a trained model's class."""
    previous = ("00", "01", "02", "03", "04", *(str(n) for n in range(5, 13)))
    listed = ["00", "01", "02", "03", "04", "05", "12"]
    message = str(_refused(listed, None, previous, False))
    pinned = message.split("--labels ", 1)[1].split(" ", 1)[0].split(",")
    assert pinned == ["00", "01", "02", "03", "04", "05", *(str(n) for n in range(6, 13))]
    names = resolve(listed, pinned, previous, True)
    assert names.index("12") == 12 and names.index("05") == 5
    # Both spellings still listed: the new one is appended, every old id stays.
    message = str(_refused(["0", "1", "01"], None, ("0", "1"), False))
    assert "--labels 0,1,01 --relabel" in message


def test_a_new_numeric_folder_takes_the_gap_its_number_falls_on():
    """03 then 07 left ids 4-6 as gaps (named 4, 5, 6); a folder 05 takes id 5 where the
    previous version kept 5 as a gap, and is a renamed label's folder otherwise."""
    previous = ("00", "01", "02", "03", "4", "5", "6", "07")
    listed = ["00", "01", "02", "03", "05"]
    names = resolve(listed, None, previous, False, {4, 5, 6})
    assert names == ("00", "01", "02", "03", "4", "05", "6", "07")
    for gaps in ({4, 6}, ()):  # 5 a label removed from the folders, or gaps not kept (older)
        message = str(_refused(listed, None, previous, False, gaps))
        assert "folder '05' has the number of the previous version's label '5'" in message


def test_gap_ids_are_the_ids_no_folder_names_and_never_a_removed_label():
    labels = ("00", "01", "02", "03", "4", "5", "6", "07")
    listed = ["00", "01", "02", "03", "07"]
    assert gap_ids(labels, listed, None, (), pinned=False) == (4, 5, 6)
    assert gap_ids(labels, listed, labels[:4], (), pinned=False) == (4, 5, 6)  # new ids
    assert gap_ids(labels, listed, labels, (4, 5, 6), pinned=False) == (4, 5, 6)  # kept
    assert gap_ids(labels, listed, labels, (), pinned=False) == ()  # removed labels, kept ids
    assert gap_ids(labels, [*listed, "5"], labels, (4, 5, 6), pinned=False) == (4, 6)
    assert gap_ids(labels, listed, None, (), pinned=True) == ()  # a pinned map names each id
