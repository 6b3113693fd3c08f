"""A run's outputs never take an input's path, a folder of the user's, or a folder for a file."""

from __future__ import annotations

import dataclasses
import json
import shutil
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfshards.cli import app
from tfshards.errors import ConfigError
from tfshards.format.schema import FeatureSpec
from tfshards.shardset.manifest import Manifest
from tfshards.training import outputs
from tfshards.training.history import SERIES
from tfshards.training.trainconfig import OUTPUTS, TrainConfig


def _set(version: Path) -> Manifest:
    schema = (FeatureSpec("image", "bytes", ()), FeatureSpec("label", "int64", ()))
    return Manifest(str(version), "f" * 16, {}, schema, ("a", "b"), "none", ())


def _config(tmp_path: Path, **outs: str | None) -> TrainConfig:
    defaults = {
        "metrics": "results/train/metrics.json",
        "live_dir": "results/train/live",
        "model_out": "models/model.keras",
        "split_out": "results/train/split.json",
    }
    paths = {k: (str(tmp_path / v) if v else v) for k, v in {**defaults, **outs}.items()}
    return TrainConfig(manifest=str(tmp_path / "data/manifest.json"), **paths)


@pytest.mark.parametrize(
    ("option", "value", "what"),
    [
        ("metrics", "data/manifest.json", "is a manifest it reads"),
        ("split_out", "data/shards/v1/data-00003-of-00016.tfrecord", "the version folder"),
        ("model_out", "data/shards/v1/model.keras", "the version folder it reads"),
        ("export_out", "data/shards/v1/export", "the version folder it reads"),
        ("live_dir", "data/shards/v1", "is the version folder it reads"),
        ("checkpoint_dir", "data/shards/v1/ckpt", "the version folder it reads"),
    ],
)
def test_an_output_on_an_input_is_refused(tmp_path, option, value, what):
    """A split file over a shard, metrics over the manifest, an export inside the version
    folder: each wrote over what the run reads, or made that set fail validate."""
    config = _config(tmp_path, **{option: value})
    with pytest.raises(ConfigError) as caught:
        outputs.check(config, [_set(tmp_path / "data/shards/v1")])
    line = str(caught.value)
    assert line.startswith(f"{option}: expected a path outside the shard sets the run reads")
    assert what in line and line.endswith("; pass another") and caught.value.option == option


def test_a_mix_manifest_a_link_and_a_file_url_are_the_paths_they_name(tmp_path):
    """A mix set's manifest took the metrics; so did a manifest named through a link or a
    file:// URL, and a split file given through a link into the version folder."""
    version = tmp_path / "data/shards/v1"
    version.mkdir(parents=True)
    (tmp_path / "data/manifest.json").write_text("{}")
    (tmp_path / "other.json").write_text("{}")
    (tmp_path / "vlink").symlink_to(version)
    (tmp_path / "mlink.json").symlink_to(tmp_path / "data/manifest.json")
    url = f"file://{tmp_path}/data/manifest.json"
    cases = [
        ({"mix": ((str(tmp_path / "other.json"), 0.3),), "metrics": "other.json"}, "metrics"),
        ({"manifest": str(tmp_path / "mlink.json"), "metrics": "data/manifest.json"}, "metrics"),
        ({"manifest": url, "split_out": "data/manifest.json"}, "split_out"),
        ({"model_out": "vlink/model.keras"}, "model_out"),
        ({"metrics": "vlink/manifest.json"}, "metrics"),
    ]
    for changes, option in cases:
        outs = {k: v for k, v in changes.items() if k in OUTPUTS}
        config = _config(tmp_path, **outs)
        config = dataclasses.replace(config, **{k: v for k, v in changes.items() if k not in outs})
        with pytest.raises(ConfigError) as caught:
            outputs.check(config, [_set(version)])
        assert caught.value.option == option, changes
        assert "expected a path outside the shard sets the run reads" in str(caught.value)


def test_a_link_in_the_live_dir_and_a_log_like_file_of_yours_are_refused(tmp_path):
    """dvclive wrote through a link in its folder into the user's files, and a
    plots/metrics/<folder>/loss.tsv of the user's looked like a series."""
    live = tmp_path / "results/train/live"
    (live / "plots").mkdir(parents=True)
    (tmp_path / "mydata").mkdir()
    (live / "plots" / "metrics").symlink_to(tmp_path / "mydata")
    with pytest.raises(ConfigError, match=r"found 'plots/metrics' in "):
        outputs.check(_config(tmp_path), [])
    (live / "plots" / "metrics").unlink()
    mine = live / "plots/metrics/my_baseline_run/loss.tsv"
    mine.parent.mkdir(parents=True)
    mine.write_text("precious")
    with pytest.raises(ConfigError, match=r"found 'plots/metrics/my_baseline_run/loss.tsv'"):
        outputs.check(_config(tmp_path), [])
    shutil.rmtree(mine.parent)
    # A series no run logs (any name.tsv was taken for one, and deleted with the log).
    (live / "plots/metrics/my_other_run.tsv").write_text("precious")
    with pytest.raises(ConfigError, match=r"found 'plots/metrics/my_other_run.tsv' in "):
        outputs.check(_config(tmp_path), [])
    (live / "plots/metrics/my_other_run.tsv").unlink()
    for name in SERIES:  # what a run logs is its own
        (live / f"plots/metrics/{name}.tsv").write_text("step\tvalue\n")
    outputs.check(_config(tmp_path), [])


def test_an_export_folder_with_entries_of_the_wrong_kind_is_refused(tmp_path):
    export = tmp_path / "exp"
    for rel in ("saved_model.pb/notes.txt", "variables/variables.data-notes/x.txt"):
        (export / rel).parent.mkdir(parents=True)
        (export / rel).write_text("mine")
        with pytest.raises(ConfigError, match=r"entries it did not make \(first: '"):
            outputs.check_target(str(export))
        shutil.rmtree(export)


def test_a_folder_where_a_file_goes_and_a_file_where_the_log_goes_are_refused(tmp_path):
    (tmp_path / "models/model.keras").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"^model_out: expected a file path, found a folder"):
        outputs.check(_config(tmp_path), [])
    (tmp_path / "models/model.keras").rmdir()
    (tmp_path / "lfile").write_text("x")
    with pytest.raises(ConfigError, match=r"^live_dir: expected a folder for dvclive's log"):
        outputs.check(_config(tmp_path, live_dir="lfile"), [])


def test_a_live_dir_holding_the_users_files_is_refused_and_a_runs_own_log_is_not(tmp_path):
    """dvclive clears its folder: --live-dir . deleted a project's params.yaml and dvc.yaml."""
    live = tmp_path / "results/train/live"
    for rel in (
        "metrics.json",
        "confusion.csv",
        "plots/metrics/loss.tsv",
        "plots/custom/val_class_accuracy.json",
        "plots/sklearn/confusion_matrix.json",
    ):
        (live / rel).parent.mkdir(parents=True, exist_ok=True)
        (live / rel).write_text("x")
    outputs.check(_config(tmp_path), [])  # an earlier run's log: taken over
    for rel in ("params.yaml", "plots/images/holiday.jpg", "plots/custom/mine.json"):
        (live / rel).parent.mkdir(parents=True, exist_ok=True)
        (live / rel).write_text("mine")
        with pytest.raises(ConfigError) as caught:
            outputs.check(_config(tmp_path), [])
        assert str(caught.value).startswith(
            f"live_dir: expected a folder holding only a run's dvclive log (or none), "
            f"found {rel!r} in "
        )
        (live / rel).unlink()


def test_train_with_live_dir_on_a_project_folder_refuses_and_deletes_nothing(tmp_path, monkeypatch):
    from tfshards.listing.listing import list_files
    from tfshards.project.sample import write_synthetic
    from tfshards.writing.config import WriteConfig
    from tfshards.writing.writer import write

    write_synthetic(str(tmp_path / "raw"), 40, 8, classes=2, workers=1)
    config = WriteConfig(
        out=str(tmp_path / "shards"), num_shards=2, manifest_copy=str(tmp_path / "m.json")
    )
    write(config, list_files(str(tmp_path / "raw")), progress=False)
    (tmp_path / "params.yaml").write_text("train:\n  epochs: 3\n")
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.chdir(tmp_path)
    out = tmp_path.parent / f"{tmp_path.name}-out"  # outputs outside the live folder
    args = ["train", "--manifest", "m.json", "--epochs", "1", "--live-dir", ".",
            "--metrics", str(out / "m.json"), "--model-out", str(out / "model.keras"),
            "--split-out", ""]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "live_dir: expected a folder holding only a run's dvclive log" in result.output
    assert (tmp_path / "params.yaml").read_text() == "train:\n  epochs: 3\n"
    assert (tmp_path / "dvc.yaml").exists() and not out.exists()


def test_a_set_whose_records_carry_one_label_is_refused_though_its_map_has_more(tmp_path):
    """Folder '3' alone maps to ids 0..3 (numeric names): 4 labels, records of one; it
    trained into val_accuracy 1.0 without a word."""
    from tfshards.listing.listing import list_files
    from tfshards.project.sample import write_synthetic
    from tfshards.training import train
    from tfshards.writing.config import WriteConfig
    from tfshards.writing.writer import write

    write_synthetic(str(tmp_path / "all"), 40, 8, classes=4, workers=1)
    raw = tmp_path / "raw"
    raw.mkdir()
    (tmp_path / "all" / "03").rename(raw / "3")
    config = WriteConfig(
        out=str(tmp_path / "shards"), num_shards=2, manifest_copy=str(tmp_path / "m.json")
    )
    manifest = write(config, list_files(str(raw)), progress=False).manifest
    assert manifest.labels == ("0", "1", "2", "3")
    with pytest.raises(ConfigError) as caught:
        train._load(TrainConfig(manifest=str(tmp_path / "m.json")))
    assert str(caught.value) == (
        f"{tmp_path / 'm.json'}: a classifier needs records of at least 2 labels, found "
        "records of 1 ('3') of the 4 in its label map"
    )


def test_a_batch_above_the_training_records_is_said_in_one_line():
    """An "epoch" of batch 5,000 over 1,479 records was ~3.4 passes, without a word."""
    from tfshards.shardset.manifest import ShardInfo
    from tfshards.shardset.split import Split
    from tfshards.training import train

    shards = (ShardInfo("data-00000-of-00002.tfrecord", 1479, 1, "0" * 64),)
    parts = Split(train=shards, val=(), seed=0, val_fraction=0.0,
                  effective_val_fraction=0.0, fingerprint="f" * 16)  # fmt: skip
    said: list[str] = []
    train._say_oversized_batch(TrainConfig(batch_size=5000), parts, None, said.append)
    assert said == [
        "batch_size 5000 is above the 1479 training records: each epoch is one step "
        "repeating them (3.4 passes); a smaller batch_size gives more steps an epoch"
    ]
    said.clear()
    train._say_oversized_batch(TrainConfig(batch_size=64), parts, None, said.append)
    assert said == []


def test_file_outputs_replace_only_what_a_run_wrote(tmp_path):
    """--metrics, --split-out and --model-out over a user's files wrote over them at the
    end of the run; refused before it starts, where an earlier run's files pass."""
    mine = {"metrics": "my/metrics.json", "split_out": "my/split.json", "model_out": "my/m.keras"}
    (tmp_path / "my").mkdir()
    for name, rel in mine.items():
        (tmp_path / rel).write_text('{"notes": "mine"}')
        with pytest.raises(ConfigError) as refused:
            outputs.check(_config(tmp_path, **{name: rel}), [])
        assert refused.value.option == name and str(refused.value).startswith(f"{name}: ")
        assert "\n" not in str(refused.value)
        assert (tmp_path / rel).read_text() == '{"notes": "mine"}'
    run = [  # every key a run's metrics.json holds: a second run was refused its own file
        "val_accuracy", "val_loss", "accuracy", "loss", "epochs", "examples_per_s",
        "input_bound_fraction", "device", "train_records", "val_records", "model",
        "mixed_precision", "jit_compile", "replicas", "strategy", "seconds",
    ]  # fmt: skip
    (tmp_path / mine["metrics"]).write_text(json.dumps(dict.fromkeys(run, 1)))
    (tmp_path / mine["split_out"]).write_text('{"train": {}, "val": {}, "seed": 0}')
    with zipfile.ZipFile(tmp_path / mine["model_out"], "w") as archive:
        archive.writestr("metadata.json", "{}")
    outputs.check(_config(tmp_path, **mine), [])  # an earlier run's: replaced


def test_outputs_given_as_file_urls_or_through_links_are_the_paths_they_name(tmp_path):
    """file:///abs was taken for the folder ./file:/abs by the live folder's and the
    checkpoint's checks (and dvclive), so a user's files there were written over; two
    outputs through a link to one folder were two paths."""
    live = tmp_path / "mine/live"
    live.mkdir(parents=True)
    (live / "notes.txt").write_text("mine")
    config = _config(tmp_path, live_dir=None)
    config = dataclasses.replace(config, live_dir=f"file://{live}")
    assert config.live_dir == str(live)
    with pytest.raises(ConfigError, match=r"found 'notes.txt' in "):
        outputs.check(config, [])
    (tmp_path / "real").mkdir()
    (tmp_path / "lk").symlink_to(tmp_path / "real")
    with pytest.raises(ConfigError, match=r"^split_out: expected a path of its own"):
        _config(tmp_path, metrics="real/same.json", split_out="lk/same.json")


def test_an_output_inside_a_version_folder_the_run_does_not_read_is_refused(tmp_path):
    """Only the version folders the run reads were refused: a file in another one failed
    that version's validate."""
    other = tmp_path / "other_set/v2"
    (other / "_work").mkdir(parents=True)
    (other / "manifest.json").write_text("{}")
    for name, rel in (("metrics", "other_set/v2/m.json"), ("live_dir", "other_set/v2/live")):
        with pytest.raises(ConfigError) as refused:
            outputs.check(_config(tmp_path, **{name: rel}), [])
        assert refused.value.option == name
        assert "expected a path outside every shard version folder" in str(refused.value)
