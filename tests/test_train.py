"""The train stage: options fail fast, the stall is measured right, and the digits are learned."""

from __future__ import annotations

import json
import signal
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
from tfshards.cli.train import parse_bool, parse_model_args
from tfshards.errors import ConfigError
from tfshards.listing.listing import list_files
from tfshards.project.sample import write_digits
from tfshards.training.checkpoint import Checkpoint
from tfshards.training.confusion import class_accuracy, confusion_matrix, to_csv
from tfshards.training.history import (
    MODEL_METRICS,
    EpochResult,
    early_stop_note,
    stop_early,
    summarize,
)
from tfshards.training.models import MODELS, model_spec
from tfshards.training.optim import balanced_class_weights, learning_rate
from tfshards.training.stall import LoopTiming, timed_loop
from tfshards.training.train import train
from tfshards.training.trainconfig import TrainConfig
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

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
    "replicas",
    "seconds",
    "strategy",
    "train_records",
    "val_accuracy",
    "val_class_accuracy",
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
        "error: unknown model 'vgg'; valid names: mobilenet_v3_small, small_cnn, "
        "or package.module:function"
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


MISSING_MANIFEST = """
import sys
from tfshards.cli import main
sys.argv = ["tfshards", "train", "--manifest", "nowhere/manifest.json"]
try:
    main()
except SystemExit as exit:
    print("exit", exit.code, "tensorflow" in sys.modules, file=sys.stderr)
"""


def test_missing_manifest_is_said_before_tensorflow_is_imported(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", MISSING_MANIFEST],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == "exit 1 False", done.stderr
    assert "nowhere/manifest.json" in lines[-2] and "Traceback" not in done.stderr


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
        "checkpoint_dir": str(out / "checkpoints/train"),
    }


TINY = {"image_size": 8, "epochs": 2, "batch_size": 64}  # a few seconds: 8 px, 2 epochs


@pytest.fixture(scope="module")
def tiny_run(digits: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`tfshards train` for 2 epochs at 8 px, run from a folder holding a dvc.yaml."""
    out = tmp_path_factory.mktemp("tiny")
    (out / "dvc.yaml").write_text("stages: {}\n")
    args = ["train", "--manifest", digits]
    outputs = {**_outputs(out), "export_out": str(out / "models/export")}
    for key, value in {**outputs, **TINY}.items():
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
    from tfshards.training import models

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


# ----------------------------------------------------------------------------- training options


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
        ({"model": "my-pkg.models:build"}, "not package.module:function"),
        ({"model_args": {"units": 3}}, "built in and takes no model_args"),
    ],
)
def test_bad_training_option_is_a_config_error(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**changes)


def _epoch(n: int, val_loss: float) -> EpochResult:
    return EpochResult(n, 1.0, 0.5, val_loss, 0.5, LoopTiming(1, 1, 0.0, 1.0))


def test_early_stopping_waits_patience_epochs_for_a_better_val_loss() -> None:
    losses = [1.0, 0.5, 0.6, 0.7]
    history = [_epoch(i + 1, v) for i, v in enumerate(losses)]
    assert not stop_early(history[:3], 2, "val_loss")  # 1 epoch since the best
    assert stop_early(history, 2, "val_loss")  # 2 epochs, none better than 0.5
    assert not stop_early(history, 0, "val_loss")  # off
    assert not stop_early([*history, _epoch(5, 0.4)], 2, "val_loss")


def test_early_stop_says_why_and_which_weights_are_kept() -> None:
    history = [_epoch(i + 1, v) for i, v in enumerate([1.0, 0.5, 0.6, 0.7])]
    assert early_stop_note(history, 2, "val_loss", 10) == (
        "stopped early after epoch 4/10: val_loss not better than 0.5000 (epoch 2) for 2 "
        "epochs; the model keeps the weights of epoch 4, the last trained, not those of epoch 2"
    )


def test_mirrored_on_one_device_says_so_and_the_metrics_name_the_strategy(
    digits: str, tmp_path: Path
) -> None:
    lines: list[str] = []
    config = TrainConfig(
        manifest=digits, image_size=8, epochs=1, strategy="mirrored", **_outputs(tmp_path)
    )  # type: ignore[arg-type]
    result = train(config, log=lines.append)
    assert lines[0] == "strategy mirrored: one device found (CPU), so one replica trains"
    assert (result.metrics["strategy"], result.metrics["replicas"]) == ("mirrored", 1)


def test_confusion_matrix_rows_are_actual_labels_and_accuracy_is_per_class() -> None:
    matrix = confusion_matrix([0, 0, 1, 1, 2], [0, 1, 1, 1, 0], 3)
    assert matrix == [[1, 1, 0], [0, 2, 0], [1, 0, 0]]
    assert class_accuracy(matrix, ["a", "b", "c"]) == {"a": 0.5, "b": 1.0, "c": 0.0}
    assert to_csv(matrix, ["a", "b", "c"]).decode().splitlines() == [
        "actual,a,b,c",
        "a,1,1,0",
        "b,0,2,0",
        "c,1,0,0",
    ]


def test_model_args_take_what_dvc_writes_for_a_mapping() -> None:
    # DVC renders {units: 8, rate: 0.5, name: wide, bn: true, sizes: [1, 2]} like this.
    args = ["--units", "8", "--rate", "0.5", "--name", "wide", "--bn", "--sizes", "1", "2"]
    assert parse_model_args(args) == {
        "units": 8,
        "rate": 0.5,
        "name": "wide",
        "bn": True,
        "sizes": [1, 2],
    }
    assert parse_model_args([]) == {}


def test_missing_model_module_is_one_line_and_exit_1(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{}")
    result = CliRunner().invoke(
        app,
        ["train", "--manifest", str(tmp_path / "manifest.json"), "--model", "nopkg.nomod:build"],
    )
    assert result.exit_code == 1
    assert result.output.startswith("error: model 'nopkg.nomod:build': cannot import 'nopkg.nomod'")
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("module", "source", "said"),
    [
        (
            "syntax_error_model",
            "def build(input_shape, classes):\n    return (\n",
            "cannot import 'syntax_error_model': SyntaxError: '(' was never closed "
            "(syntax_error_model.py, line 2)",
        ),
        (
            "raising_import_model",
            "import os\n\nSIZE = int(os.environ.get('NO_SUCH_SIZE', 'wide'))\n",
            "cannot import 'raising_import_model': ValueError: invalid literal for int() "
            "with base 10: 'wide' (raising_import_model.py:3)",
        ),
    ],
)
def test_a_model_module_that_fails_to_import_is_one_line_naming_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, source: str, said: str
) -> None:
    (tmp_path / f"{module}.py").write_text(source)
    (tmp_path / "manifest.json").write_text("{}")  # never read: the module fails first
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        app, ["train", "--manifest", "manifest.json", "--model", f"{module}:build"]
    )
    assert result.exit_code == 1
    assert result.output == f"error: model '{module}:build': {said}\n"


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


@pytest.mark.slow
def test_a_builder_that_raises_stops_the_stage_in_one_line(digits: str, tmp_path: Path) -> None:
    (tmp_path / "raising_builder_model.py").write_text(RAISING_BUILDER)
    done = subprocess.run(
        [
            *(sys.executable, str(REPO / "stages/train.py"), "--manifest", digits),
            *("--model", "raising_builder_model:build", "--image-size", "8", "--epochs", "1"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert done.stderr.endswith(
        "error: model 'raising_builder_model:build': build((8, 8, 1), 10) raised "
        "KeyError: 'conv' (raising_builder_model.py:4)\n"
    ), done.stderr[-3000:]
    assert "Traceback" not in done.stderr


USER_MODEL = """
import keras


def build(input_shape, classes, units=16, dropout=0.0):
    inputs = keras.Input(input_shape)
    x = keras.layers.Flatten()(inputs)
    x = keras.layers.Dense(units, activation="relu", name="hidden")(x)
    x = keras.layers.Dropout(dropout)(x)
    outputs = keras.layers.Dense(classes, activation="softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="user_mlp")
"""


@pytest.mark.slow
def test_user_model_from_a_module_trains_through_the_stage(digits: str, tmp_path: Path) -> None:
    import keras

    (tmp_path / "mymodels.py").write_text(USER_MODEL)
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "stages/train.py"),
            "--manifest",
            digits,
            "--model",
            "mymodels:build",
            "--image-size",
            "8",
            "--epochs",
            "1",
            "--metrics",
            "metrics.json",
            "--live-dir",
            "live",
            "--model-out",
            "model.keras",
            "--",
            "--units",
            "24",
            "--dropout",
            "0.1",
        ],
        cwd=tmp_path,  # DVC runs stages in the repository root: the module is found there
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["model"] == "mymodels:build"
    assert metrics["epochs"] == 1
    model = keras.models.load_model(tmp_path / "model.keras")
    assert model.get_layer("hidden").units == 24


@pytest.mark.slow
def test_every_training_option_at_once_trains_and_uint8_is_scaled_in_the_model(
    digits: str, tmp_path: Path
) -> None:
    import keras
    import numpy as np

    config = TrainConfig(
        manifest=digits,
        image_size=8,
        epochs=3,
        optimizer="sgd",
        learning_rate=0.05,
        lr_schedule="cosine",
        warmup_epochs=1,
        early_stopping=1,
        label_smoothing=0.1,
        class_weight="balanced",
        augment=("flip", "crop"),
        image_dtype="uint8",
        seed=1,
        split_seed=0,
        **_outputs(tmp_path),  # type: ignore[arg-type]
    )
    result = train(config)
    assert 1 <= result.metrics["epochs"] <= 3
    assert result.metrics["loss"] == result.metrics["loss"]  # not NaN
    assert json.loads((tmp_path / "results/train/split.json").read_text())["seed"] == 0
    model = keras.models.load_model(tmp_path / "models/model.keras")
    assert model.input.dtype == "uint8"
    image = np.full((1, 8, 8, 1), 255, np.uint8)
    # Augmentation is for training only: inference is the same every call.
    np.testing.assert_array_equal(model.predict(image, verbose=0), model.predict(image, verbose=0))


# ----------------------------------------------------------------------------- what it learned


def test_confusion_csv_has_a_row_per_label_summing_to_the_val_records(
    tiny_run: tuple[Path, str], digits: str
) -> None:
    out, _ = tiny_run
    labels = json.loads(Path(digits).read_text())["labels"]
    metrics = json.loads((out / "results/train/metrics.json").read_text())
    rows = (out / "results/train/live/confusion.csv").read_text().splitlines()
    assert rows[0].split(",") == ["actual", *labels]
    assert [r.split(",")[0] for r in rows[1:]] == labels
    assert sum(int(c) for r in rows[1:] for c in r.split(",")[1:]) == metrics["val_records"]
    assert set(metrics["val_class_accuracy"]) == set(labels)
    plot = json.loads((out / "results/train/live/plots/sklearn/confusion_matrix.json").read_text())
    assert len(plot) == metrics["val_records"]  # one {actual, predicted} per record
    assert {p["actual"] for p in plot} <= set(labels)


def test_finished_run_removes_its_checkpoint(tiny_run: tuple[Path, str]) -> None:
    out, _ = tiny_run
    assert not (out / "checkpoints/train").exists()


SERVE = """
import json, sys
import tensorflow as tf
served = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
images = [open(path, "rb").read() for path in sys.argv[2:]]
png = tf.io.decode_png(images[0])
images.append(tf.io.encode_jpeg(png, quality=100).numpy())  # the same image as a JPEG
out = served(images=tf.constant(images))
print(json.dumps({
    "labels": [v.decode() for v in out["label"].numpy()],
    "probabilities": out["probabilities"].numpy().tolist(),
    "tfshards": "tfshards" in sys.modules,
}))
"""


def test_export_predicts_from_raw_png_and_jpeg_bytes_with_plain_tensorflow(
    tiny_run: tuple[Path, str], digits: str
) -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    out, _ = tiny_run
    pngs = sorted((Path(digits).parent / "raw").rglob("*.png"))[:3]
    done = subprocess.run(
        [sys.executable, "-c", SERVE, str(out / "models/export"), *map(str, pngs)],
        cwd="/",  # not the repository: nothing of tfshards on the path
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    served = json.loads(done.stdout.strip().splitlines()[-1])
    assert served["tfshards"] is False
    labels = json.loads(Path(digits).read_text())["labels"]
    assert len(served["labels"]) == 4 and set(served["labels"]) <= set(labels)
    model = keras.models.load_model(out / "models/model.keras")
    images = [tf.image.resize(tf.io.decode_png(p.read_bytes(), 1), (8, 8)) / 255 for p in pngs]
    expected = model.predict(np.stack(images), verbose=0)
    np.testing.assert_allclose(served["probabilities"][:3], expected, atol=1e-5)
    np.testing.assert_allclose(served["probabilities"][3], expected[0], atol=0.05)  # JPEG loss


# ----------------------------------------------------------------------------- resume


KILLED_AT_EPOCH_2 = """
import os, signal, sys
from tfshards.training.train import train
from tfshards.training.trainconfig import TrainConfig

def log(line):
    print(line, flush=True)
    if line.startswith("epoch 2/4"):  # epoch 2 is checkpointed and logged: die hard
        os.kill(os.getpid(), signal.SIGKILL)

train(TrainConfig(**eval(sys.argv[1])), log=log)
"""


@pytest.mark.slow
def test_run_killed_after_epoch_2_resumes_at_3_and_ends_like_an_uninterrupted_run(
    digits: str, tmp_path: Path
) -> None:
    settings: dict[str, Any] = {"manifest": digits, "image_size": 8, "epochs": 4}
    whole = train(TrainConfig(**settings, **_outputs(tmp_path / "whole")))  # type: ignore[arg-type]

    config = {**settings, **_outputs(tmp_path / "killed")}
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_AT_EPOCH_2, repr(config)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert killed.stdout.splitlines()[-1].startswith("epoch 2/4")
    assert (tmp_path / "killed/checkpoints/train/state.json").exists()

    lines: list[str] = []
    resumed = train(TrainConfig(**config), log=lines.append)  # type: ignore[arg-type]
    assert lines[0] == f"resuming after epoch 2/4 from {config['checkpoint_dir']}"
    assert [line.split(":")[0] for line in lines[1:]] == ["epoch 3/4", "epoch 4/4"]
    for name in MODEL_METRICS:
        assert resumed.metrics[name] == pytest.approx(whole.metrics[name], abs=1e-6), name
    assert resumed.metrics["epochs"] == 4
    # dvclive went on counting: steps 0..3, each once.
    rows = (tmp_path / "killed/results/train/live/plots/metrics/val_loss.tsv").read_text()
    assert [r.split("\t")[0] for r in rows.splitlines()[1:]] == ["0", "1", "2", "3"]
    assert not (tmp_path / "killed/checkpoints/train").exists()


def test_checkpoint_made_with_other_settings_is_removed_not_resumed(tmp_path: Path) -> None:
    Checkpoint(str(tmp_path / "ck"), "key-a").save(1, [])
    said: list[str] = []
    assert Checkpoint(str(tmp_path / "ck"), "key-b").restore(said.append) == (0, [])
    assert "made with other settings" in said[0]
    assert not (tmp_path / "ck").exists()


# ----------------------------------------------------------------------------- several devices


MIRRORED = """
import json, sys
import tensorflow as tf

# Two logical CPU devices: must happen before anything initializes TensorFlow's devices.
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from tfshards.training.train import train
from tfshards.training.trainconfig import TrainConfig

settings = eval(sys.argv[1])
print(json.dumps({s: train(TrainConfig(strategy=s, **settings)).metrics for s in sys.argv[2:]}))
"""


@pytest.mark.slow
def test_mirrored_over_two_cpu_devices_learns_like_one_device(digits: str, tmp_path: Path) -> None:
    settings = {
        "manifest": digits,
        "image_size": 8,
        "epochs": 4,
        "learning_rate": 0.003,
        "metrics": str(tmp_path / "metrics.json"),
        "live_dir": None,
        "model_out": None,
        "split_out": None,
    }
    done = subprocess.run(
        [sys.executable, "-c", MIRRORED, repr(settings), "mirrored", "one"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    assert (runs["mirrored"]["replicas"], runs["one"]["replicas"]) == (2, 1)
    assert runs["one"]["val_accuracy"] > 0.8, runs
    # Same steps up to float summation order and per-replica dropout masks.
    assert abs(runs["mirrored"]["val_accuracy"] - runs["one"]["val_accuracy"]) < 0.05, runs


def test_batch_that_does_not_split_evenly_over_replicas_is_a_config_error() -> None:
    from tfshards.training.steps import TrainSteps

    class TwoReplicas:
        num_replicas_in_sync = 2

    with pytest.raises(ConfigError, match="batch_size 63 must be a multiple of the 2 replicas"):
        TrainSteps(None, None, strategy=TwoReplicas(), classes=2, global_batch=63)


# ----------------------------------------------------------------------------- input


@pytest.mark.parametrize("scaled", [True, False])
def test_scaled_decode_param_decides_how_the_loader_decodes(tmp_path: Path, scaled: bool) -> None:
    import numpy as np

    from tfshards.project.sample import write_synthetic
    from tfshards.reading import loader
    from tfshards.training.train import _dataset

    write_synthetic(str(tmp_path / "raw"), 8, 64, workers=1)  # 64 px JPEGs read at 16: ratio 4
    config = WriteConfig(out=str(tmp_path / "shards"), num_shards=2, executor="serial")
    m = write(config, list_files(str(tmp_path / "raw")), progress=False).manifest
    train_config = TrainConfig(image_size=16, batch_size=8, scaled_decode=scaled)
    got = next(iter(_dataset(loader, m.shards, m, train_config, training=False)))[0].numpy()

    def read(scaled_decode: bool) -> Any:
        data = loader.make_dataset(
            m.shards,
            m,
            batch_size=8,
            training=False,
            image_size=(16, 16),
            scaled_decode=scaled_decode,
        )
        return next(iter(data))[0].numpy()

    np.testing.assert_array_equal(got, read(scaled))
    assert not np.array_equal(got, read(not scaled))
