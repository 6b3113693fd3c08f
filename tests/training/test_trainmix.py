"""The train option ``mix``: parsed and refused in one line, checked before training, and a run
whose batches hold each set's share of every epoch, resumable mid-epoch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tfshards.cli import app
from tfshards.errors import ConfigError
from tfshards.listing.listing import list_files
from tfshards.project import stageoptions
from tfshards.project.sample import write_synthetic
from tfshards.reading import mixing
from tfshards.shardset import manifest as manifests
from tfshards.shardset.split import split
from tfshards.training import trainmix
from tfshards.training.trainconfig import OPTIONS, TrainConfig
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

IMAGES, SHARDS, VAL = 64, 4, 0.25


def _shards(
    tmp: Path,
    name: str,
    *,
    seed: int,
    classes: int = 2,
    raw: Path | None = None,
    shards: int = SHARDS,
) -> str:
    """64 synthetic 8 px PNGs in ``shards`` shards (``raw``: these files instead); the manifest's
    path."""
    if raw is None:
        raw = tmp / f"raw-{name}"
        write_synthetic(str(raw), IMAGES, 8, fmt="png", classes=classes, seed=seed, workers=1)
    copy = str(tmp / f"{name}.json")
    config = WriteConfig(
        out=str(tmp / name), num_shards=shards, executor="serial", manifest_copy=copy, seed=seed
    )
    write(config, list_files(str(raw)), progress=False)
    return copy


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Three sets of 2 labels (a; b; leak: b's files in 8 shards, so split otherwise: 24 of
    its training files are b's validation files), one of 3 labels (other)."""
    tmp = tmp_path_factory.mktemp("mix")
    found = {name: _shards(tmp, name, seed=seed) for name, seed in (("a", 1), ("b", 2))}
    found["leak"] = _shards(tmp, "leak", seed=3, raw=tmp / "raw-b", shards=8)
    found["other"] = _shards(tmp, "other", seed=4, classes=3)
    return found


# --- the option ---------------------------------------------------------------


def test_none_parses_to_no_mix_and_leaves_the_checkpoint_key_as_before() -> None:
    defaults = {o.name: o.default for o in OPTIONS}
    config = stageoptions.config(TrainConfig, OPTIONS, defaults)
    assert config.mix == () and config == TrainConfig()
    assert "mix" not in config.settings()
    assert TrainConfig(mix=(("b.json", 0.3),)).settings()["mix"] == (("b.json", 0.3),)


def test_pairs_keep_a_urls_own_colon() -> None:
    assert trainmix.parse("s3://bucket/b/manifest.json:0.3, c.json:0.2") == (
        ("s3://bucket/b/manifest.json", 0.3),
        ("c.json", 0.2),
    )


@pytest.mark.parametrize(
    ("mix", "found"),
    [
        ("b.json:0.6,c.json:0.4", "found b.json:0.6, c.json:0.4 (sum 1)"),
        ("b.json:0", "found b.json:0 (sum 0)"),
        ("b.json:-0.2", "found b.json:-0.2"),
    ],
)
def test_weights_at_or_past_the_whole_or_not_positive_are_one_line(mix: str, found: str) -> None:
    with pytest.raises(ConfigError) as info:
        TrainConfig(mix=trainmix.parse(mix))
    message = str(info.value)
    assert "\n" not in message and message.startswith("mix: expected weights > 0")
    assert found in message


@pytest.mark.parametrize("mix", ["b.json", "b.json:x", ":0.2", "b.json:0.2,"])
def test_a_bad_mix_string_exits_1_in_one_line(mix: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["train", "--manifest", str(tmp_path / "m.json"), "--mix", mix]
    )
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --mix: expected PATH:WEIGHT"), lines


def test_mix_under_multi_worker_is_refused() -> None:
    with pytest.raises(ConfigError, match="mix: expected strategy one"):
        TrainConfig(mix=(("b.json", 0.3),), strategy="multi_worker")


# --- the sets, checked before training ------------------------------------------------


def _load(main: str, mix: trainmix.Pairs) -> trainmix.Mix | None:
    manifest = manifests.load(main)
    return trainmix.load_sets(main, manifest, split(manifest, VAL, 0), mix, VAL, 0)


def test_a_batch_above_a_mixed_epoch_is_said_in_one_line(sets: dict[str, str]) -> None:
    from tfshards.reading import mixing
    from tfshards.training import train

    mix = _load(sets["a"], ((sets["b"], 0.3),))
    assert mix is not None
    epoch = mixing.plan_of(mix.sources()).epoch_size
    said: list[str] = []
    config = TrainConfig(batch_size=epoch + 1)
    train._say_oversized_batch(config, mix.parts[0], mix, said.append)
    assert len(said) == 1
    assert said[0].startswith(f"batch_size {epoch + 1} is above the {epoch} records of a mixed")


def test_sets_are_split_like_the_manifest_and_weighed_the_rest(sets: dict[str, str]) -> None:
    mix = _load(sets["a"], ((sets["b"], 0.25),))
    assert mix is not None and mix.weights == (0.75, 0.25)
    assert mix.parts[1] == split(manifests.load(sets["b"]), VAL, 0)
    assert mix.metric() == f"{sets['a']}:0.75,{sets['b']}:0.25"
    assert _load(sets["a"], ()) is None


def test_other_labels_are_one_line(sets: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as info:
        _load(sets["a"], ((sets["other"], 0.3),))
    message = str(info.value)
    assert "\n" not in message and message.startswith("mix: expected the labels of --manifest")
    assert "has ['02']" in message


def test_a_file_one_set_trains_on_and_another_validates_on_fails_in_one_line(
    sets: dict[str, str],
) -> None:
    with pytest.raises(ConfigError) as info:
        _load(sets["b"], ((sets["leak"], 0.3),))
    message = str(info.value)
    assert "\n" not in message and ", found 24: " in message and "validates on as" in message
    assert message.startswith("mix: expected no record of one set's training side")


# --- a run --------------------------------------------------------------------


def _config(a: str, b: str, out: Path, **extra: Any) -> TrainConfig:
    return TrainConfig(
        manifest=a,
        mix=((b, 0.25),),
        model="tinymodel:tiny_model",
        image_size=8,
        batch_size=8,
        epochs=2,
        val_fraction=VAL,
        metrics=str(out / "metrics.json"),
        live_dir=None,
        model_out=None,
        split_out=None,
        **extra,
    )


def _ids(manifest_path: str, shards: Any) -> set[str]:
    """The batch-trace ids of ``shards``' records, read as training reads them."""
    from tfshards.reading import loader
    from tfshards.training.batchtrace import record_ids

    data = loader.make_dataset(
        shards, manifests.load(manifest_path), batch_size=64, training=False, image_size=(8, 8)
    )
    return {i for x, y in data for i in record_ids(x.numpy(), y.numpy())}


def _trace(path: Path) -> list[tuple[int, list[str]]]:
    return [tuple(json.loads(line)) for line in path.read_text().splitlines()]  # type: ignore[misc]


def test_each_epoch_holds_each_sets_share_and_validates_on_the_manifest_alone(
    sets: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tfshards.training.train import train

    monkeypatch.setenv("TFSHARDS_TRAIN_TRACE", str(tmp_path / "trace-{worker}.jsonl"))
    result = train(_config(sets["a"], sets["b"], tmp_path))
    mix = _load(sets["a"], ((sets["b"], 0.25),))
    assert mix is not None
    a_ids, b_ids = (_ids(p, parts.train) for p, parts in zip(mix.names, mix.parts, strict=True))
    steps = _trace(tmp_path / "trace-0.jsonl")
    per_epoch = len(steps) // 2
    epoch_size = mixing.plan_of(mix.sources()).epoch_size  # 72: 54 of a's records, 18 of b's
    assert len(steps) == 2 * per_epoch and per_epoch == epoch_size // 8
    for epoch in range(2):
        ids = [i for _, batch in steps[epoch * per_epoch : (epoch + 1) * per_epoch] for i in batch]
        assert set(ids) <= a_ids | b_ids
        share = sum(i in b_ids for i in ids) / len(ids)
        assert abs(share - 0.25) <= 0.005, (epoch, share)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["mix_sources"] == mix.metric()
    assert metrics["val_records"] == mix.parts[0].val_records
    assert metrics["train_records"] == epoch_size  # a mixed epoch's, not the manifest's side
    assert result.split == mix.parts[0]


@pytest.mark.slow
def test_a_mix_stopped_mid_epoch_resumes_at_its_last_saved_step(
    sets: dict[str, str], tmp_path: Path
) -> None:
    from tfshards.training.batchtrace import record_ids
    from tfshards.training.train import train

    whole: list[tuple[int, list[str]]] = []
    stopped: list[tuple[int, list[str]]] = []
    resumed: list[tuple[int, list[str]]] = []

    def tracer(into: list[tuple[int, list[str]]], stop: int) -> Any:
        def on_batch(step: int, batch: Any) -> None:
            if step == stop:
                raise KeyboardInterrupt
            into.append((step, record_ids(batch[0].numpy(), batch[1].numpy())))

        return on_batch

    train(_config(sets["a"], sets["b"], tmp_path / "whole"), on_batch=tracer(whole, -1))
    config = _config(
        sets["a"],
        sets["b"],
        tmp_path / "parts",
        checkpoint_dir=str(tmp_path / "checkpoints"),
        checkpoint_every_steps=4,
    )
    with pytest.raises(KeyboardInterrupt):
        train(config, on_batch=tracer(stopped, 7))  # saved after steps 0..3, stopped at 7
    train(config, on_batch=tracer(resumed, -1))
    assert len(whole) // 2 > 7 and resumed[0][0] == 4  # mid-epoch 1
    steps = dict(stopped + resumed)  # the resumed run's steps 4..6 replace the stopped run's
    assert sorted(steps) == [s for s, _ in whole]
    assert [steps[s] for s, _ in whole] == [ids for _, ids in whole]
    shutil.rmtree(tmp_path / "checkpoints", ignore_errors=True)
