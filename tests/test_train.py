"""The train stage: options fail fast, the stall is measured right, and the digits are learned."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tfshards.cli import app
from tfshards.cli.train import parse_bool
from tfshards.errors import ConfigError
from tfshards.listing import list_files
from tfshards.models import MODELS, model_spec
from tfshards.sample import write_digits
from tfshards.train import (
    EpochResult,
    LoopTiming,
    TrainConfig,
    summarize,
    timed_loop,
    train,
)
from tfshards.writer import WriteConfig, write

REPO = Path(__file__).resolve().parents[1]
DIGITS, SHARDS = 1797, 16
# What `dvc metrics show` lists for the train stage (and tfshards.summary reads).
METRIC_KEYS = {
    "accuracy",
    "device",
    "epochs",
    "examples_per_s",
    "input_bound_fraction",
    "jit_compile",
    "loss",
    "mixed_precision",
    "model",
    "seconds",
    "train_records",
    "val_accuracy",
    "val_loss",
    "val_records",
}


# ----------------------------------------------------------------------------- options


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
        ("learning_rate", 0.0, "learning_rate must be > 0"),
        ("val_fraction", 1.0, r"val_fraction must be in \[0, 1\), got 1.0"),
        ("mixed_precision", "maybe", "mixed_precision must be one of"),
        ("model_out", "models/model.h5", "must end with .keras"),
    ],
)
def test_bad_option_is_a_config_error_naming_it(field: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**{field: value})


@pytest.mark.parametrize(("text", "expected"), [("true", True), ("False", False), ("1", True)])
def test_bool_options_take_what_dvc_writes(text: str, expected: bool) -> None:
    assert parse_bool(text, "--deterministic") is expected


# ----------------------------------------------------------------------------- stall measurement


@dataclass
class FakeClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


def _batches(clock: FakeClock, n: int, load_s: float) -> Iterator[list[int]]:
    for i in range(n):
        clock.now += load_s
        yield [i] * 4


def test_waits_for_data_are_the_input_bound_fraction() -> None:
    clock = FakeClock()

    def step(batch: list[int]) -> int:
        clock.now += 1.0
        return batch[0]

    timing = timed_loop(_batches(clock, 10, 3.0), 10, step, count=len, clock=clock)
    assert timing == LoopTiming(steps=10, examples=40, wait_s=30.0, total_s=40.0)
    assert timing.input_bound_fraction == 0.75
    assert timing.examples_per_s == 1.0


def test_one_step_stays_in_flight_and_every_step_is_synced() -> None:
    calls: list[str] = []

    def step(batch: list[int]) -> int:
        calls.append(f"step {batch[0]}")
        return batch[0]

    timed_loop(iter([[0], [1], [2]]), 3, step, count=len, sync=lambda r: calls.append(f"sync {r}"))
    assert calls == ["step 0", "step 1", "sync 0", "step 2", "sync 1", "sync 2"]


def test_loop_stops_when_the_data_runs_out() -> None:
    timing = timed_loop(iter([[1, 2], [3]]), 10, lambda b: None, count=len)
    assert (timing.steps, timing.examples) == (2, 3)


def test_real_slow_loader_reads_near_1_and_real_slow_model_near_0() -> None:
    def slow_loader() -> Iterator[int]:
        for i in range(5):
            time.sleep(0.02)
            yield i

    loader_bound = timed_loop(slow_loader(), 5, lambda b: None, count=lambda b: 1)
    model_bound = timed_loop(iter(range(5)), 5, lambda b: time.sleep(0.02), count=lambda b: 1)
    assert 0.8 < loader_bound.input_bound_fraction <= 1.0
    assert 0.0 <= model_bound.input_bound_fraction < 0.2


@pytest.mark.parametrize(("wait", "total"), [(0.0, 0.0), (2.0, 1.0), (0.0, 5.0)])
def test_input_bound_fraction_is_always_in_0_1(wait: float, total: float) -> None:
    assert 0.0 <= LoopTiming(1, 1, wait, total).input_bound_fraction <= 1.0


def test_summary_timings_leave_out_the_first_epoch() -> None:
    epochs = [
        EpochResult(1, 2.0, 0.1, 2.1, 0.1, LoopTiming(10, 640, wait_s=9.0, total_s=10.0)),
        EpochResult(2, 0.5, 0.8, 0.6, 0.7, LoopTiming(10, 640, wait_s=1.0, total_s=2.0)),
        EpochResult(3, 0.25, 0.9, 0.3, 0.875, LoopTiming(10, 640, wait_s=0.0, total_s=2.0)),
    ]
    metrics = summarize(epochs, device="CPU", train_records=640, val_records=100)
    assert metrics == {
        "accuracy": 0.9,
        "device": "CPU",
        "epochs": 3,
        "examples_per_s": 320.0,
        "input_bound_fraction": 0.25,
        "loss": 0.25,
        "train_records": 640,
        "val_accuracy": 0.875,
        "val_loss": 0.3,
        "val_records": 100,
    }


# ----------------------------------------------------------------------------- CLI


def test_unknown_model_on_the_command_line_is_one_line_and_exit_1() -> None:
    result = CliRunner().invoke(app, ["train", "--model", "vgg"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "error: unknown model 'vgg'; valid names: mobilenet_v3_small, small_cnn"
    ]


def test_a_bool_option_that_is_not_a_bool_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["train", "--jit-compile", "sometimes"])
    assert result.exit_code == 2
    assert "expected true or false" in result.output


def test_stage_script_help_runs_in_a_real_process_without_tensorflow() -> None:
    done = subprocess.run(
        [sys.executable, "stages/train.py", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    for option in ("--epochs", "--image-size", "--mixed-precision", "--live-dir", "--split-out"):
        assert option in done.stdout
    probe = "import sys, tfshards.cli; print('tensorflow' in sys.modules, 'keras' in sys.modules)"
    imported = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert imported.stdout.split() == ["False", "False"], imported.stderr


# ----------------------------------------------------------------------------- training runs


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The 1,797 digits in 16 shards; returns the manifest copy's path."""
    tmp = tmp_path_factory.mktemp("digits")
    assert write_digits(str(tmp / "raw")) == DIGITS
    manifest = str(tmp / "manifest.json")
    config = WriteConfig(
        out=str(tmp / "shards"),
        num_shards=SHARDS,
        executor="serial",
        seed=42,
        manifest_copy=manifest,
    )
    write(config, list_files(str(tmp / "raw")), progress=False)
    return manifest


def _outputs(out: Path) -> dict[str, str]:
    return {
        "metrics": str(out / "results/train/metrics.json"),
        "live_dir": str(out / "results/train/live"),
        "model_out": str(out / "models/model.keras"),
        "split_out": str(out / "results/train/split.json"),
    }


TINY = {"image_size": 8, "epochs": 2, "batch_size": 64}  # a few seconds: 8 px, 2 epochs


@pytest.fixture(scope="module")
def tiny_run(digits: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`tfshards train` for 2 epochs at 8 px, run from a folder holding a dvc.yaml."""
    out = tmp_path_factory.mktemp("tiny")
    (out / "dvc.yaml").write_text("stages: {}\n")
    args = ["train", "--manifest", digits]
    for key, value in {**_outputs(out), **TINY}.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(out)
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return out, result.output


def test_metrics_json_holds_what_dvc_metrics_show_needs(tiny_run: tuple[Path, str]) -> None:
    out, output = tiny_run
    metrics = json.loads((out / "results/train/metrics.json").read_text())
    assert set(metrics) == METRIC_KEYS
    assert metrics["epochs"] == 2
    assert metrics["device"] == "CPU"
    assert metrics["model"] == "small_cnn"
    assert metrics["mixed_precision"] is False  # "auto" without a GPU
    assert metrics["train_records"] + metrics["val_records"] == DIGITS
    assert 0.0 <= metrics["input_bound_fraction"] <= 1.0
    assert metrics["examples_per_s"] > 0
    assert 0.0 <= metrics["val_accuracy"] <= 1.0
    assert "epoch 2/2: loss" in output
    assert output.strip().splitlines()[-1].startswith("trained small_cnn for 2 epochs")


def test_split_json_puts_every_shard_on_exactly_one_side(
    tiny_run: tuple[Path, str], digits: str
) -> None:
    out, _ = tiny_run
    split = json.loads((out / "results/train/split.json").read_text())
    metrics = json.loads((out / "results/train/metrics.json").read_text())
    manifest = json.loads(Path(digits).read_text())
    train_shards, val_shards = split["train"]["shards"], split["val"]["shards"]
    assert not set(train_shards) & set(val_shards)
    assert sorted(train_shards + val_shards) == sorted(s["name"] for s in manifest["shards"])
    assert split["train"]["records"] == metrics["train_records"]
    assert split["val"]["records"] == metrics["val_records"]
    assert split["fingerprint"] == manifest["fingerprint"]
    assert abs(split["effective_val_fraction"] - 0.2) < 0.03


def test_dvclive_logs_every_epoch_and_leaves_dvc_yaml_alone(tiny_run: tuple[Path, str]) -> None:
    out, _ = tiny_run
    plots = out / "results/train/live/plots/metrics"
    names = {p.stem for p in plots.glob("*.tsv")}
    assert names == {
        "loss",
        "accuracy",
        "val_loss",
        "val_accuracy",
        "examples_per_s",
        "input_bound_fraction",
    }
    rows = (plots / "val_accuracy.tsv").read_text().splitlines()
    assert rows[0].split("\t") == ["step", "val_accuracy"]
    assert [r.split("\t")[0] for r in rows[1:]] == ["0", "1"]
    assert (out / "dvc.yaml").read_text() == "stages: {}\n"
    assert not list(out.glob("results/train/live/**/dvc.yaml"))
    assert not (out / "results/train/live/report.html").exists()


def test_saved_model_loads_and_outputs_float32_probabilities(tiny_run: tuple[Path, str]) -> None:
    import keras
    import numpy as np

    out, _ = tiny_run
    model = keras.models.load_model(out / "models/model.keras")
    probs = model.predict(np.zeros((3, 8, 8, 1), np.float32), verbose=0)
    assert probs.shape == (3, 10)
    assert probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)


def test_same_seed_trains_the_same_model(
    tiny_run: tuple[Path, str], digits: str, tmp_path: Path
) -> None:
    out, _ = tiny_run
    first = json.loads((out / "results/train/metrics.json").read_text())
    config = TrainConfig(manifest=digits, **TINY, **_outputs(tmp_path))  # type: ignore[arg-type]
    again = train(config).metrics
    timings = {"examples_per_s", "input_bound_fraction", "seconds"}
    assert {k: v for k, v in again.items() if k not in timings} == {
        k: v for k, v in first.items() if k not in timings
    }


def test_mixed_precision_keeps_float32_outputs() -> None:
    import keras

    from tfshards.models import build_model

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


@pytest.mark.slow
def test_default_params_learn_the_digits(digits: str, tmp_path: Path) -> None:
    """Catches label scrambling anywhere from the raw folders to the batches."""
    config = TrainConfig(manifest=digits, **_outputs(tmp_path))  # type: ignore[arg-type]
    result = train(config)
    assert result.metrics["val_accuracy"] >= 0.95, result.metrics
    assert result.metrics["epochs"] == config.epochs == 10


@pytest.mark.slow
def test_gpu_code_path_runs_on_cpu_mixed_precision_xla_and_determinism(
    digits: str, tmp_path: Path
) -> None:
    """The GPU settings, forced on CPU: loss scaling, XLA and op determinism together."""
    config = TrainConfig(
        manifest=digits,
        image_size=8,
        epochs=1,
        mixed_precision="on",
        jit_compile=True,
        deterministic=True,
        **_outputs(tmp_path),  # type: ignore[arg-type]
    )
    metrics = train(config).metrics
    assert (metrics["mixed_precision"], metrics["jit_compile"]) == (True, True)
    assert metrics["loss"] == metrics["loss"]  # not NaN: the loss scale kept float16 finite


def test_op_without_deterministic_xla_kernel_is_a_config_error(
    digits: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MaxPool's gradient has no deterministic XLA kernel: the error says which option to drop."""
    from tfshards import models

    def max_pool_cnn(size: int, channels: int, classes: int) -> Any:
        import keras
        from keras import layers

        inputs = keras.Input((size, size, channels))
        x = layers.MaxPooling2D()(layers.Conv2D(4, 3, padding="same")(inputs))
        x = layers.Dense(classes)(layers.Flatten()(x))
        return keras.Model(inputs, layers.Activation("softmax", dtype="float32")(x))

    monkeypatch.setitem(models._BUILDERS, "small_cnn", max_pool_cnn)
    config = TrainConfig(
        manifest=digits, image_size=8, epochs=1, jit_compile=True, **_outputs(tmp_path)
    )  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="no deterministic implementation on CPU under XLA"):
        train(config)
