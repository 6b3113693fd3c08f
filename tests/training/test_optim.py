"""Optimizers, learning-rate schedules and class weights."""

from __future__ import annotations

import pytest

from tfshards.errors import ConfigError
from tfshards.training.optim import balanced_class_weights, check, learning_rate, make_optimizer


def test_balanced_class_weights_make_every_class_weigh_the_same() -> None:
    counts = [10, 30, 60]
    weights = balanced_class_weights(counts)
    assert [w * c for w, c in zip(weights, counts, strict=True)] == pytest.approx([100 / 3] * 3)
    assert balanced_class_weights([5, 0]) == [1.0, 0.0]


def test_cosine_schedule_warms_up_from_0_then_decays_to_0() -> None:
    schedule = learning_rate(0.1, "cosine", total_steps=100, warmup_steps=10)
    rates = [float(schedule(step)) for step in (0, 5, 10, 55, 100)]
    assert rates == pytest.approx([0.0, 0.05, 0.1, 0.05, 0.0], abs=1e-6)
    assert learning_rate(0.1, "constant", total_steps=100) == 0.1


@pytest.mark.parametrize(
    ("names", "option"),
    [
        (("rmsprop", "constant", "none"), "optimizer"),
        (("adam", "step", "none"), "lr_schedule"),
        (("adam", "constant", "inverse"), "class_weight"),
    ],
)
def test_a_name_that_is_not_a_choice_is_a_config_error_naming_its_option(
    names: tuple[str, str, str], option: str
) -> None:
    with pytest.raises(ConfigError, match=f"{option} must be one of") as info:
        check(*names)
    assert info.value.option == option


def test_warm_up_needs_the_cosine_schedule_and_steps_left_to_decay_over() -> None:
    with pytest.raises(ConfigError, match="warmup_epochs needs lr_schedule cosine"):
        learning_rate(0.1, "constant", total_steps=100, warmup_steps=10)
    with pytest.raises(ConfigError, match="warm-up of 100 steps leaves none of the 100"):
        learning_rate(0.1, "cosine", total_steps=100, warmup_steps=100)
    with pytest.raises(ConfigError, match="warmup steps must be >= 0, got -1"):
        learning_rate(0.1, "cosine", total_steps=100, warmup_steps=-1)


def test_cosine_without_warm_up_starts_at_the_peak() -> None:
    schedule = learning_rate(0.1, "cosine", total_steps=100)
    assert [float(schedule(s)) for s in (0, 50, 100)] == pytest.approx([0.1, 0.05, 0.0], abs=1e-6)


def test_each_optimizer_name_makes_its_keras_optimizer_with_its_own_setting() -> None:
    import keras

    sgd = make_optimizer("sgd", 0.1, momentum=0.5, weight_decay=0.0)
    adamw = make_optimizer("adamw", 0.1, momentum=0.0, weight_decay=0.25)
    adam = make_optimizer("adam", 0.1, momentum=0.5, weight_decay=0.25)
    assert isinstance(sgd, keras.optimizers.SGD) and sgd.momentum == 0.5
    assert isinstance(adamw, keras.optimizers.AdamW) and adamw.weight_decay == 0.25
    assert type(adam) is keras.optimizers.Adam
    assert float(adam.learning_rate) == pytest.approx(0.1)


def test_balanced_weights_need_records_to_count() -> None:
    with pytest.raises(ConfigError, match="needs records to count, found none"):
        balanced_class_weights([0, 0])
