"""The loader's options check themselves when built, each with one line naming the value."""

from __future__ import annotations

import pytest

from tfshards.errors import ConfigError
from tfshards.reading.epochorder import Position
from tfshards.reading.options import DecodeOptions, ReadOptions


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: ReadOptions(batch_size=0, training=False),
            "batch_size must be an integer >= 1, got 0",
        ),
        (
            lambda: ReadOptions(batch_size=8.0, training=False),  # type: ignore[arg-type]
            "batch_size must be an integer >= 1, got 8.0",
        ),
        (
            lambda: ReadOptions(batch_size="8", training=False),  # type: ignore[arg-type]
            "batch_size must be an integer >= 1, got '8'",
        ),
        (
            lambda: ReadOptions(batch_size=8, training=True, seed=None),  # type: ignore[arg-type]
            "seed must be an integer, got None",
        ),
        (
            lambda: ReadOptions(batch_size=8, training=True, shuffle_buffer=-1),
            "shuffle_buffer must be an integer >= 0, got -1",
        ),
        (
            lambda: ReadOptions(batch_size=8, training=True, cycle_length=0),
            "cycle_length must be an integer >= 1, got 0",
        ),
        (
            lambda: ReadOptions(batch_size=8, training=True, worker=(0.5, 2)),  # type: ignore[arg-type]
            r"worker must be \(index, count\) integers, got \(0.5, 2\)",
        ),
        (
            lambda: DecodeOptions(image_size=16),  # type: ignore[arg-type]
            r"image_size must be \(height, width\) integers >= 1, got 16",
        ),
        (
            lambda: DecodeOptions(features="path"),
            "features must be a list of names, got 'path'",
        ),
        (lambda: DecodeOptions(channels=2), "channels must be 1, 3 or 4, got 2"),
        (
            lambda: DecodeOptions(image_dtype="float16"),
            "image_dtype must be 'float32' or 'uint8', got 'float16'",
        ),
        (
            lambda: DecodeOptions(image_size=(0, 5)),
            r"image_size must be \(height, width\) integers >= 1, got \(0, 5\)",
        ),
        (
            lambda: DecodeOptions(image_size=(5,)),  # type: ignore[arg-type]
            r"image_size must be \(height, width\) integers >= 1, got \(5,\)",
        ),
        (
            lambda: ReadOptions(batch_size=1, training=True, order="fifo"),
            "order must be one of \\('epoch', 'buffer'\\), got 'fifo'",
        ),
        (
            lambda: ReadOptions(batch_size=1, training=True, worker=(2, 2)),
            r"worker must be \(index, count\), 0 <= index < count, got \(2, 2\)",
        ),
        (
            lambda: ReadOptions(batch_size=1, training=False, start=(1, 0)),
            "start and worker need training=True with order='epoch'",
        ),
        (
            lambda: ReadOptions(batch_size=1, training=True, order="buffer", worker=(0, 2)),
            "start and worker need training=True with order='epoch'",
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


def test_a_start_tuple_becomes_a_position():
    read = ReadOptions(batch_size=4, training=True, start=(2, 30))
    assert read.position == Position(2, 30)
    assert ReadOptions(batch_size=4, training=True).position == Position(0, 0)


def test_numpy_integers_are_integers():
    import numpy as np

    read = ReadOptions(batch_size=np.int64(8), training=True, seed=np.int32(3), worker=(0, 1))
    assert read.batch_size == 8 and read.seed == 3


@pytest.mark.parametrize(
    "start",
    [("a", 0), (0, 1.5), (1.5, 0), (True, 1), (1,), (0, 0, 0), "00", (2**62, 0), (-1, 0)],
)
def test_a_start_that_is_not_two_whole_counts_is_one_config_error(start):
    with pytest.raises(ConfigError, match=r"^start must be \(epoch, record\)") as info:
        ReadOptions(batch_size=4, training=True, start=start)
    assert "\n" not in str(info.value)
