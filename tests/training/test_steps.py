"""The compiled steps: replicas split a batch evenly, the loss falls, evaluation sees all."""

from __future__ import annotations

from typing import Any

import pytest

from tfshards.errors import ConfigError
from tfshards.training.steps import TrainSteps


def test_batch_that_does_not_split_evenly_over_replicas_is_a_config_error() -> None:
    from tfshards.training.steps import TrainSteps

    class TwoReplicas:
        num_replicas_in_sync = 2

    with pytest.raises(ConfigError, match="batch_size 63 must be a multiple of the 2 replicas"):
        TrainSteps(None, None, strategy=TwoReplicas(), classes=2, global_batch=63)


def _tiny_problem() -> tuple[Any, Any]:
    """32 two-feature records whose class is the sign of their first feature."""
    import numpy as np

    x = np.linspace(-1.0, 1.0, 64, dtype=np.float32).reshape(32, 2)
    y = (x[:, 0] > 0).astype(np.int32)
    return x, y


def _steps(**options: Any) -> TrainSteps:
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, activation="softmax")])
    return TrainSteps(
        model,
        keras.optimizers.SGD(0.5),
        strategy=tf.distribute.get_strategy(),
        classes=2,
        global_batch=32,
        **options,
    )


@pytest.mark.parametrize(
    "options",
    [{}, {"label_smoothing": 0.1, "class_weights": [1.0, 3.0]}],
    ids=["plain", "weighted"],
)
def test_steps_lower_the_loss_and_metrics_reset_each_epoch(options: dict[str, Any]) -> None:
    x, y = _tiny_problem()
    steps = _steps(**options)
    losses = []
    for _ in range(20):
        steps.train(x, y)
        losses.append(steps.train_metrics()[0])
    assert losses[-1] < losses[0]
    _, accuracy = steps.train_metrics()  # no step since the last call
    assert accuracy == 0.0


def test_evaluate_returns_every_label_and_prediction_in_order() -> None:
    import tensorflow as tf

    x, y = _tiny_problem()
    steps = _steps()
    for _ in range(30):
        steps.train(x, y)
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(10)  # 10, 10, 10, 2
    loss, accuracy, labels, predicted = steps.evaluate(batches)
    assert labels == y.tolist() and len(predicted) == 32
    hits = sum(a == p for a, p in zip(labels, predicted, strict=True))
    assert accuracy == pytest.approx(hits / 32)
    assert accuracy > 0.8 and loss > 0.0
