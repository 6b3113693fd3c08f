"""The loader's options check themselves when built, each with one line naming the value."""

from __future__ import annotations

import pytest

from tfshards.errors import ConfigError
from tfshards.reading.options import DecodeOptions, ReadOptions


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ReadOptions(batch_size=0, training=False), "batch_size must be >= 1, got 0"),
        (lambda: DecodeOptions(channels=2), "channels must be 1, 3 or 4, got 2"),
        (
            lambda: DecodeOptions(image_dtype="float16"),
            "image_dtype must be 'float32' or 'uint8', got 'float16'",
        ),
        (
            lambda: DecodeOptions(image_size=(0, 5)),
            r"image_size must be \(height, width\) >= 1, got \(0, 5\)",
        ),
        (
            lambda: DecodeOptions(image_size=(5,)),  # type: ignore[arg-type]
            r"image_size must be \(height, width\) >= 1, got \(5,\)",
        ),
    ],
)
def test_a_bad_option_is_one_config_error_line(build, message):  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=f"^{message}$"):
        build()


def test_repeat_and_drop_remainder_follow_training_unless_given():
    training = ReadOptions(batch_size=8, training=True)
    assert (training.repeats, training.drops_remainder) == (True, True)
    once = ReadOptions(batch_size=8, training=True, repeat=False)
    assert (once.repeats, once.drops_remainder) == (False, False)
    kept = ReadOptions(batch_size=8, training=False, drop_remainder=True)
    assert (kept.repeats, kept.drops_remainder) == (False, True)


def test_options_are_frozen_values():
    decoding = DecodeOptions(image_size=[32, 24], features=["image", "path"])  # type: ignore[arg-type]
    assert decoding == DecodeOptions(image_size=(32, 24), features=("image", "path"))
    with pytest.raises(AttributeError):
        decoding.channels = 3  # type: ignore[misc]
