"""How the weights move: the optimizer, its learning-rate schedule and class weights.

Names are checked without TensorFlow; Keras is imported only by
:func:`make_optimizer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tfshards.errors import ConfigError

OPTIMIZERS = ("adam", "sgd", "adamw")
SCHEDULES = ("constant", "cosine")
CLASS_WEIGHTS = ("none", "balanced")


def check(optimizer: str, schedule: str, class_weight: str) -> None:
    """Raise :class:`ConfigError` for a name that is not one of the choices."""
    for option, value, valid in (
        ("optimizer", optimizer, OPTIMIZERS),
        ("lr_schedule", schedule, SCHEDULES),
        ("class_weight", class_weight, CLASS_WEIGHTS),
    ):
        if value not in valid:
            raise ConfigError(f"{option} must be one of {valid}, got {value!r}", option=option)


def learning_rate(
    peak: float, schedule: str, *, total_steps: int, warmup_steps: int = 0
) -> float | Any:
    """The learning rate: ``peak`` for ``constant``, else a Keras schedule over the steps.

    ``cosine`` rises linearly from 0 to ``peak`` over ``warmup_steps``, then
    decays along a half cosine to 0 at ``total_steps``. Warm-up needs the
    cosine schedule and must leave at least one step to decay over.
    """
    check("adam", schedule, "none")
    if warmup_steps < 0:
        raise ConfigError(f"warmup steps must be >= 0, got {warmup_steps}")
    if schedule == "constant":
        if warmup_steps:
            raise ConfigError("warmup_epochs needs lr_schedule cosine (constant has no warm-up)")
        return peak
    if warmup_steps >= total_steps:
        raise ConfigError(
            f"warm-up of {warmup_steps} steps leaves none of the {total_steps} to decay over; "
            "lower warmup_epochs"
        )
    import keras

    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup_steps else peak,
        decay_steps=total_steps - warmup_steps,
        warmup_target=peak if warmup_steps else None,
        warmup_steps=warmup_steps,
    )


def make_optimizer(name: str, rate: float | Any, *, momentum: float, weight_decay: float) -> Any:
    """A Keras optimizer: ``adam``, ``sgd`` (with ``momentum``) or ``adamw`` (``weight_decay``)."""
    check(name, "constant", "none")
    import keras

    if name == "sgd":
        return keras.optimizers.SGD(rate, momentum=momentum)
    if name == "adamw":
        return keras.optimizers.AdamW(rate, weight_decay=weight_decay)
    return keras.optimizers.Adam(rate)


def balanced_class_weights(counts: Sequence[int]) -> list[float]:
    """Per-class loss weights ``n / (classes * count)``: every class weighs the same in total.

    scikit-learn's ``class_weight="balanced"`` formula, over the classes that
    occur (the mean weight per record stays 1). A class with no records gets
    weight 0 (it never occurs, so its weight is unused).

    Raises:
        ConfigError: no records at all.
    """
    total = sum(counts)
    if total <= 0:
        raise ConfigError("class_weight balanced needs records to count, found none")
    classes = sum(1 for c in counts if c)
    return [total / (classes * c) if c else 0.0 for c in counts]
