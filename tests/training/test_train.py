"""The train stage end to end: its outputs, the same seed, resuming, several devices."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tfshards.cli import app
from tfshards.errors import ConfigError
from tfshards.listing.listing import list_files
from tfshards.project.sample import write_digits
from tfshards.training.history import MODEL_METRICS
from tfshards.training.train import train
from tfshards.training.trainconfig import TrainConfig
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

REPO = Path(__file__).resolve().parents[2]
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
    "val_loss",
    "val_records",
}


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
    import keras

    keras.utils.clear_session()  # layer names as a fresh process numbers them (conv2d, not _4)
    threads = set(threading.enumerate())
    again = train(config).metrics
    assert set(threading.enumerate()) <= threads  # none left behind (dvclive's Studio poster)
    timings = {"examples_per_s", "input_bound_fraction", "seconds"}
    assert {k: v for k, v in again.items() if k not in timings} == {
        k: v for k, v in first.items() if k not in timings
    }
    # The same weights, the same file (another process, another time): dvc.lock stays put.
    model = (tmp_path / "models/model.keras").read_bytes()
    assert model == (out / "models/model.keras").read_bytes()


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


# ----------------------------------------------------------------------- models through the stage


RAISING_BUILDER = """
def build(input_shape, classes, units=16):
    layers = {"dense": units}
    return layers["conv"]
"""


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
            *(sys.executable, "-X", "importtime"),  # to see what the stage imported
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
    # Keras would import scikit-learn with TensorFlow (~0.9 s of CPU); the confusion
    # matrix plot is written without it.
    imported = re.findall(r"^import time:.*\| +([\w.]+)$", done.stderr, re.M)
    assert "tensorflow" in imported  # and no module of scikit-learn (a failed try logs "sklearn")
    assert not [name for name in imported if name.startswith("sklearn.")]
    assert (tmp_path / "live/plots/sklearn/confusion_matrix.json").exists()


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
    assert list(metrics)[:2] == ["val_accuracy", "val_loss"]  # what `dvc exp show` lists first
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
empty = served(images=tf.constant([], tf.string))  # a request with no image
print(json.dumps({
    "labels": [v.decode() for v in out["label"].numpy()],
    "probabilities": out["probabilities"].numpy().tolist(),
    "empty": {k: list(v.shape) for k, v in empty.items()},
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
    assert served["empty"] == {"class_id": [0], "label": [0], "probabilities": [0, len(labels)]}
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
    elsewhere = {**config, "manifest": os.path.relpath(digits)}  # the same set by another path
    resumed = train(TrainConfig(**elsewhere), log=lines.append)  # type: ignore[arg-type]
    assert lines[0] == f"resuming after epoch 2/4 from {config['checkpoint_dir']}"
    assert [line.split(":")[0] for line in lines[1:]] == ["epoch 3/4", "epoch 4/4"]
    for name in MODEL_METRICS:
        assert resumed.metrics[name] == pytest.approx(whole.metrics[name], abs=1e-6), name
    assert resumed.metrics["epochs"] == 4
    # dvclive went on counting: steps 0..3, each once.
    rows = (tmp_path / "killed/results/train/live/plots/metrics/val_loss.tsv").read_text()
    assert [r.split("\t")[0] for r in rows.splitlines()[1:]] == ["0", "1", "2", "3"]
    assert not (tmp_path / "killed/checkpoints/train").exists()


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


def test_a_tensorflow_error_the_records_cause_is_one_line(tmp_path: Path) -> None:
    """Statistics edited to call PNGs JPEGs: the scaled JPEG decode meets a PNG."""
    from tfshards.errors import InputError
    from tfshards.project.sample import write_synthetic

    write_synthetic(str(tmp_path / "img"), 24, 48, workers=1)
    write_synthetic(str(tmp_path / "img"), 8, 48, fmt="png", workers=1, classes=2, seed=9)
    manifest = str(tmp_path / "manifest.json")
    config = WriteConfig(out=str(tmp_path / "shards"), num_shards=4, manifest_copy=manifest)
    version = Path(write(config, list_files(str(tmp_path / "img")), progress=False).manifest.root)
    stats = version / "imagestats.json"
    doc = json.loads(stats.read_text())
    for bucket in doc["buckets"].values():  # each bucket's images all called JPEGs
        bucket["formats"] = {"JPEG": sum(bucket["formats"].values())}
    stats.write_text(json.dumps(doc))
    train_config = TrainConfig(manifest=manifest, **TINY, **_outputs(tmp_path))  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"training stopped: Invalid JPEG data, size \d+ \("):
        train(train_config)


def test_a_damaged_image_stops_training_naming_it_and_the_checks_that_find_it(
    tmp_path: Path,
) -> None:
    """A PNG whose last chunk has a wrong CRC passes write and validate's defaults (its
    header and end are whole; TensorFlow refuses it): the stage names the record, and how
    validate would have found it (write decodes nothing, so on_error: skip would keep it)."""
    import io

    from PIL import Image

    from tfshards.errors import RecordError
    from tfshards.project.sample import write_synthetic

    write_synthetic(str(tmp_path / "img"), 24, 16, workers=1)
    first = sorted((tmp_path / "img").rglob("*.jpg"))[-1]
    last = first.with_suffix(".png")
    out = io.BytesIO()
    Image.open(first).save(out, "PNG")
    first.unlink()
    last.write_bytes(out.getvalue()[:-4] + bytes(4))  # IEND's CRC zeroed
    manifest = str(tmp_path / "manifest.json")
    config = WriteConfig(out=str(tmp_path / "shards"), num_shards=2, manifest_copy=manifest)
    write(config, list_files(str(tmp_path / "img")), progress=False)
    train_config = TrainConfig(manifest=manifest, **TINY, **_outputs(tmp_path))  # type: ignore[arg-type]
    with pytest.raises(RecordError) as stopped:
        train(train_config)
    said = str(stopped.value)
    assert last.relative_to(tmp_path / "img").as_posix() in said
    assert said.endswith(
        "; `validate.decode: true` (validate --decode) finds such records before training: "
        "replace or remove the file, and run the pipeline again"
    )
