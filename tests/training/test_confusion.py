"""The confusion matrix, per-class accuracy and its CSV."""

from __future__ import annotations

import pytest

from tfshards.errors import ConfigError
from tfshards.training.confusion import class_accuracy, confusion_matrix, to_csv


def test_confusion_matrix_rows_are_actual_labels_and_accuracy_is_per_class() -> None:
    matrix = confusion_matrix([0, 0, 1, 1, 2], [0, 1, 1, 1, 0], 3)
    assert matrix == [[1, 1, 0], [0, 2, 0], [1, 0, 0]]
    assert class_accuracy(matrix, ["a", "b", "c"]) == {"a": 0.5, "b": 1.0, "c": 0.0}
    assert to_csv(matrix, ["a", "b", "c"]).decode().splitlines() == [
        "actual,a,b,c",
        "a,1,1,0",
        "b,0,2,0",
        "c,1,0,0",
    ]


def test_labels_and_predictions_of_different_lengths_are_refused() -> None:
    with pytest.raises(ConfigError, match="3 labels but 2 predictions"):
        confusion_matrix([0, 1, 1], [0, 1], 2)


def test_a_class_id_out_of_range_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"class id out of range 0..1: label 0, predicted 2"):
        confusion_matrix([0], [2], 2)


def test_class_accuracy_leaves_out_labels_with_no_record() -> None:
    matrix = confusion_matrix([1, 1, 1], [1, 0, 1], 3)
    assert class_accuracy(matrix, ["a", "b", "c"]) == {"b": 0.666667}


def test_csv_quotes_a_label_holding_a_comma() -> None:
    text = to_csv([[2, 0], [0, 1]], ["cat, big", "dog"]).decode()
    assert text.splitlines() == ['actual,"cat, big",dog', '"cat, big",2,0', "dog,0,1"]
