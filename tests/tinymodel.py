"""A model for tests that train many times: next to nothing to build, trace and run."""

from __future__ import annotations

from typing import Any


def tiny_model(input_shape: tuple[int, ...], classes: int) -> Any:
    """Flatten, dropout (its seed state is a variable a resumed run must restore), softmax:
    3.4 s of CPU for a forked one-worker run where ``small_cnn`` takes 6.5 s."""
    import keras
    from keras import layers

    inputs = keras.Input(input_shape)
    x = layers.Dropout(0.3, seed=1)(layers.Flatten()(inputs))
    return keras.Model(inputs, layers.Dense(classes, activation="softmax")(x))
