"""The classifiers: float32 outputs under mixed precision, user models' errors, the input layers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfshards.errors import ConfigError
from tfshards.training.models import is_user_model, model_spec


def test_mixed_precision_keeps_float32_outputs() -> None:
    import keras

    from tfshards.training.models import build_model

    policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        for name, size in (("small_cnn", 8), ("mobilenet_v3_small", 32)):
            model = build_model(name, image_size=size, channels=1, classes=10)
            assert model.layers[-2].compute_dtype == "float16", name  # the body runs in float16
            assert model.output.dtype == "float32", name
            assert tuple(model.output.shape) == (None, 10), name
    finally:
        keras.mixed_precision.set_global_policy(policy)


RAISING_BUILDER = """
def build(input_shape, classes, units=16):
    layers = {"dense": units}
    return layers["conv"]
"""


def test_a_builder_that_raises_is_a_config_error_naming_the_call_and_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tfshards.training.models import build_model

    (tmp_path / "raising_builder_model.py").write_text(RAISING_BUILDER)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        build_model(
            "raising_builder_model:build",
            image_size=8,
            channels=1,
            classes=3,
            model_args={"units": 4},
        )
    assert str(caught.value) == (
        "model 'raising_builder_model:build': build((8, 8, 1), 3, units=4) raised "
        "KeyError: 'conv' (raising_builder_model.py:4)"
    )
    with pytest.raises(ConfigError, match=r"model_args \{'depth': 2\}: .*'depth'"):
        build_model(
            "raising_builder_model:build",
            image_size=8,
            channels=1,
            classes=3,
            model_args={"depth": 2},
        )


NO_SOFTMAX = """
import keras
from keras import layers


def logits(input_shape, classes):
    inputs = keras.Input(input_shape)
    return keras.Model(inputs, layers.Dense(classes)(layers.Flatten()(inputs)))


def softmax(input_shape, classes):
    inputs = keras.Input(input_shape)
    x = layers.Dense(classes)(layers.Flatten()(inputs))
    return keras.Model(inputs, layers.Activation("softmax")(x))
"""


def test_a_user_model_without_a_softmax_is_refused_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Logits trained without a word into 0.25 accuracy where a softmax got 0.82."""
    from tfshards.training.models import build_model

    (tmp_path / "no_softmax_model.py").write_text(NO_SOFTMAX)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    shape = {"image_size": 8, "channels": 1, "classes": 3}
    with pytest.raises(ConfigError) as caught:
        build_model("no_softmax_model:logits", **shape)
    assert str(caught.value).startswith(
        "model 'no_softmax_model:logits' must end in a softmax: expected outputs >= 0 that "
        "sum to 1 for each image, found sums "
    )
    assert build_model("no_softmax_model:softmax", **shape).output.shape[-1] == 3


def test_a_user_model_name_is_checked_for_its_form_only() -> None:
    assert is_user_model("mypkg.models:build") and not is_user_model("small_cnn")
    assert model_spec("mypkg.models:build", 1).min_image_size == 1
    with pytest.raises(ConfigError, match=r"not package\.module:function"):
        model_spec("my-pkg.models:build", 8)


def test_uint8_input_is_scaled_in_the_model_like_float_input() -> None:
    import keras
    import numpy as np

    from tfshards.training.models import with_input

    keras.utils.set_random_seed(0)
    inputs = keras.Input((2, 2, 1))
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(inputs)))
    assert with_input(model, image_dtype="float32", augment=(), seed=0) is model
    scaled = with_input(model, image_dtype="uint8", augment=("flip",), seed=0)
    image = np.array([[[[0], [255]], [[51], [102]]]], np.uint8)
    np.testing.assert_allclose(
        scaled.predict(image, verbose=0), model.predict(image / 255, verbose=0), rtol=1e-5
    )
    with pytest.raises(ConfigError, match=r"augment must be among .*\['rotate'\]"):
        with_input(model, image_dtype="float32", augment=("rotate",), seed=0)
