"""What a classifier got wrong: the confusion matrix and per-class accuracy, from labels."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

from tfshards.errors import ConfigError


def confusion_matrix(
    actual: Sequence[int], predicted: Sequence[int], classes: int
) -> list[list[int]]:
    """``matrix[a][p]``: records of class ``a`` predicted as ``p``; rows sum to each class's count.

    Raises:
        ConfigError: the two sequences differ in length, or a class id is out of range.
    """
    if len(actual) != len(predicted):
        raise ConfigError(f"{len(actual)} labels but {len(predicted)} predictions")
    matrix = [[0] * classes for _ in range(classes)]
    for a, p in zip(actual, predicted, strict=True):
        if not (0 <= a < classes and 0 <= p < classes):
            raise ConfigError(f"class id out of range 0..{classes - 1}: label {a}, predicted {p}")
        matrix[a][p] += 1
    return matrix


def class_accuracy(matrix: Sequence[Sequence[int]], labels: Sequence[str]) -> dict[str, float]:
    """Per label: the share of its records predicted right (labels with no record left out)."""
    out: dict[str, float] = {}
    for i, (label, row) in enumerate(zip(labels, matrix, strict=True)):
        total = sum(row)
        if total:
            out[label] = round(row[i] / total, 6)
    return out


def to_csv(matrix: Sequence[Sequence[int]], labels: Sequence[str]) -> bytes:
    """The matrix as CSV: a header ``actual,<label>...``, then one row per actual label."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["actual", *labels])
    for label, row in zip(labels, matrix, strict=True):
        writer.writerow([label, *row])
    return out.getvalue().encode()
