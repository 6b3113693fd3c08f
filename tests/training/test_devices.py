"""Where training runs: the device's name, the strategy, TensorFlow state restored after a run."""

from __future__ import annotations

import pytest

from tfshards.errors import ConfigError
from tfshards.training.devices import check_tf_config, device_name, make_strategy, tf_state


def test_device_name_is_the_first_gpu_or_cpu() -> None:
    import tensorflow as tf

    name = device_name()
    if tf.config.list_physical_devices("GPU"):
        assert name.startswith("GPU:0 (") and name.endswith(")")
    else:
        assert name == "CPU"


def test_one_and_auto_below_two_gpus_are_the_default_strategy() -> None:
    import tensorflow as tf

    assert make_strategy("one") is tf.distribute.get_strategy()
    assert make_strategy("one").num_replicas_in_sync == 1
    if len(tf.config.list_logical_devices("GPU")) < 2:
        assert make_strategy("auto") is tf.distribute.get_strategy()


def test_a_run_sets_policy_and_determinism_and_restores_both_after_an_error() -> None:
    import keras
    from tensorflow.python.framework import config as tf_config

    before = keras.mixed_precision.global_policy().name
    deterministic_before = tf_config.is_op_determinism_enabled()
    with pytest.raises(RuntimeError, match="inside"), tf_state(0, deterministic=True, mixed=True):
        assert keras.mixed_precision.global_policy().name == "mixed_float16"
        assert tf_config.is_op_determinism_enabled()
        raise RuntimeError("inside")
    assert keras.mixed_precision.global_policy().name == before
    assert tf_config.is_op_determinism_enabled() == deterministic_before


def test_the_same_seed_draws_the_same_numbers_in_numpy_and_tensorflow() -> None:
    import numpy as np
    import tensorflow as tf

    def draw(seed: int) -> tuple[list[float], list[float]]:
        with tf_state(seed, deterministic=False, mixed=False):
            return np.random.rand(3).tolist(), tf.random.uniform((3,)).numpy().tolist()

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("not json", "TF_CONFIG: expected JSON, found 'not json'"),
        ("[1]", 'TF_CONFIG: expected {"cluster": {"worker": [...]}, "task"'),
        (
            '{"cluster": {"worker": ["127.0.0.1:23456"]}, "task": {"type": "worker", "index": 3}}',
            "TF_CONFIG: task 'worker' 3 is not in the cluster (its 'worker' hosts: "
            "['127.0.0.1:23456'])",
        ),
        (
            '{"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}',
            "TF_CONFIG: task 'chief' 0 is not in the cluster (its 'chief' hosts: None)",
        ),
    ],
)
def test_a_tf_config_tensorflow_would_fail_on_is_one_line(text, said):
    with pytest.raises(ConfigError) as refused:
        check_tf_config(text)
    assert str(refused.value).startswith(said)


def test_a_tf_config_that_names_this_task_passes():
    for text in (
        None,
        "",
        '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}',
    ):
        check_tf_config(text)
