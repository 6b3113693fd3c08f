"""The train config: every option checked on construction; built from the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tfshards.errors import ConfigError
from tfshards.project import stageoptions
from tfshards.training.models import MODELS, model_spec
from tfshards.training.trainconfig import OPTIONS, TrainConfig


def test_unknown_model_name_lists_the_valid_names() -> None:
    with pytest.raises(ConfigError) as info:
        TrainConfig(model="resnet50")
    message = str(info.value)
    assert "'resnet50'" in message
    assert all(name in message for name in MODELS)
    assert info.value.valid == sorted(MODELS)  # type: ignore[attr-defined]


def test_mobilenet_needs_images_of_at_least_32_pixels() -> None:
    with pytest.raises(ConfigError, match=r"at least 32x32 pixels, got image_size=16") as info:
        TrainConfig(model="mobilenet_v3_small", image_size=16)
    assert info.value.min_image_size == 32  # type: ignore[attr-defined]
    TrainConfig(model="mobilenet_v3_small", image_size=32)


def test_small_cnn_takes_the_digits_at_their_own_8_pixels() -> None:
    assert model_spec("small_cnn", 8).min_image_size == 8
    with pytest.raises(ConfigError, match="at least 8x8"):
        TrainConfig(image_size=7)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("epochs", 0, "epochs must be >= 1, got 0"),
        ("batch_size", 0, "batch_size must be >= 1"),
        ("learning_rate", 0.0, "learning_rate must be finite and > 0"),
        ("val_fraction", 1.0, r"val_fraction must be in \[0, 1\), got 1.0"),
        ("mixed_precision", "maybe", "mixed_precision must be one of"),
        ("model_out", "models/model.h5", "must end with .keras"),
    ],
)
def test_bad_option_is_a_config_error_naming_it(field: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**{field: value})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"optimizer": "rmsprop"}, "optimizer must be one of"),
        ({"lr_schedule": "step"}, "lr_schedule must be one of"),
        ({"warmup_epochs": 2}, "warmup_epochs needs lr_schedule cosine"),
        ({"lr_schedule": "cosine", "warmup_epochs": 10}, "warmup_epochs must be < epochs"),
        ({"class_weight": "inverse"}, "class_weight must be one of"),
        ({"augment": ("rotate",)}, "augment must be one of"),
        ({"image_dtype": "float16"}, "image_dtype must be one of"),
        ({"strategy": "tpu"}, "strategy must be one of"),
        ({"label_smoothing": 1.0}, r"label_smoothing must be in \[0, 1\)"),
        ({"early_stopping_metric": "loss"}, "early_stopping_metric must be one of"),
        (
            {"early_stopping": 1, "val_fraction": 0.0},
            "early_stopping 1: expected a validation side to watch val_loss on, found "
            "val_fraction 0",
        ),
        ({"model": "my-pkg.models:build"}, "not package.module:function"),
        ({"model_args": {"units": 3}}, "built in and takes no model_args"),
    ],
)
def test_bad_training_option_is_a_config_error(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**changes)


def from_options(changes: dict[str, Any]) -> TrainConfig:
    """The config from every option's default, with ``changes``, as the command line gives them."""
    values = {o.name: o.default for o in OPTIONS}
    return stageoptions.config(TrainConfig, OPTIONS, {**values, **changes})


def test_this_repositorys_train_params_are_the_defaults() -> None:
    """The pipeline's training (tests/project/test_pipeline.py) is a run of the defaults."""
    params = yaml.safe_load((Path(__file__).resolve().parents[2] / "params.yaml").read_text())
    assert from_options(params["train"]) == TrainConfig()


def test_options_as_the_command_line_spells_them_make_the_config() -> None:
    assert from_options({}) == TrainConfig()  # the options' defaults are the config's
    config = from_options(
        {"augment": " flip,crop ", "export_out": "", "checkpoint_dir": "", "epochs": 3}
    )
    assert config == TrainConfig(augment=("flip", "crop"), epochs=3)
    assert (config.export_out, config.checkpoint_dir) == (None, None)
    quiet = from_options({"live_dir": "", "split_out": ""})  # '' is none, as for export_out
    assert (quiet.live_dir, quiet.split_out) == (None, None)
    named = from_options({"augment": "none", "export_out": "out", "checkpoint_dir": "ck"})
    assert (named.augment, named.export_out, named.checkpoint_dir) == ((), "out", "ck")


def test_a_bad_option_given_as_text_is_still_checked() -> None:
    with pytest.raises(ConfigError, match="augment must be one of"):
        from_options({"augment": "flip,rotate", "export_out": "", "checkpoint_dir": ""})


def test_settings_leave_out_where_the_outputs_go() -> None:
    a = TrainConfig(metrics="a/metrics.json", live_dir=None, checkpoint_dir="ck-a")
    b = TrainConfig(metrics="b/metrics.json", model_out=None, checkpoint_dir="ck-b")
    assert a.settings() == b.settings()
    assert a.settings()["seed"] == 0 and "metrics" not in a.settings()
    assert TrainConfig(seed=1).settings() != a.settings()


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        ({"model_out": "exp/model.keras", "export_out": "exp"}, "export_out: expected a path"),
        ({"live_dir": "exp", "export_out": "exp"}, "export_out: expected a path of its own"),
        ({"metrics": "s.json", "split_out": "s.json"}, "split_out: expected a path of its own"),
        ({"metrics": "live/m.json", "live_dir": "live"}, "live_dir: expected a path of its own"),
    ],
)
def test_two_outputs_on_one_path_are_refused_before_training(outputs, message):
    """The export replaced a folder holding the model; a split file replaced the metrics."""
    base = {"metrics": None, "live_dir": None, "model_out": None, "split_out": None}
    with pytest.raises(ConfigError, match=message):
        TrainConfig(manifest="m.json", **{**base, "export_out": None, **outputs})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("learning_rate", float("inf"), "learning_rate must be finite and > 0"),
        ("momentum", 5.0, r"momentum must be in \[0, 1\]"),
        ("momentum", float("nan"), r"momentum must be in \[0, 1\]"),
        ("weight_decay", float("inf"), "weight_decay must be finite and >= 0"),
        ("seed", -1, r"seed must be in \[0, 2\*\*32\)"),
        ("seed", 2**64, r"seed must be in \[0, 2\*\*32\)"),
        ("epochs", 10**20, "epochs must be at most 1000000"),
        ("image_size", 100_000, "image_size must be at most 4096"),
    ],
)
def test_values_keras_or_numpy_would_fail_on_are_one_line(field, value, message):
    """They gave NumPy's or Keras' tracebacks, or trained to a NaN loss and exit 0."""
    with pytest.raises(ConfigError, match=message):
        TrainConfig(manifest="m.json", **{field: value})
