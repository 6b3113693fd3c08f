"""A run SIGKILLed mid-epoch, again and again, resumes at its last checkpointed step: the
runs together read every batch of an uninterrupted run once, in its order."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
from pathlib import Path
from typing import Any

import pytest

from forkrun import Forker
from tfshards.listing.listing import list_files
from tfshards.project.sample import write_synthetic
from tfshards.shardset import manifest as manifests
from tfshards.shardset.split import split
from tfshards.training.batchtrace import record_ids
from tfshards.training.history import MODEL_METRICS
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

IMAGES, SHARDS, BATCH, EPOCHS, EVERY, VAL = 96, 6, 8, 4, 4, 0.25
# Seed 0 kills as steps [1, 8, 9, 12, 13, 15, 16, 24, 28, 31] of 32 begin: at three epochs'
# first steps, two mid-epoch saves, the last step, and four times after a kill at the same save.
KILLS, SEED = 10, 0
HERE = str(Path(__file__).parent)
Run = list[tuple[int, list[str]]]  # (step, the ids of its batch's records) of one run


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> str:
    """96 synthetic 8 px PNGs of 3 classes in 6 shards; the manifest copy's path."""
    tmp = tmp_path_factory.mktemp("resume")
    write_synthetic(str(tmp / "raw"), IMAGES, 8, fmt="png", classes=3, workers=1)
    copy = str(tmp / "manifest.json")
    config = WriteConfig(
        out=str(tmp / "shards"), num_shards=SHARDS, executor="serial", manifest_copy=copy
    )
    write(config, list_files(str(tmp / "raw")), progress=False)
    return copy


def _config(manifest: str, out: Path) -> dict[str, Any]:
    return {
        "manifest": manifest,
        "model": "tinymodel:tiny_model",
        "image_size": 8,
        "batch_size": BATCH,
        "epochs": EPOCHS,
        "val_fraction": VAL,
        "checkpoint_every_steps": EVERY,
        "metrics": str(out / "metrics.json"),
        "live_dir": None,
        "model_out": None,
        "split_out": None,
        "checkpoint_dir": str(out / "checkpoints"),
    }


def run_until(config: dict[str, Any], trace: str, kill_at: int) -> None:
    """Train ``config``, appending each step's record ids to ``trace``; SIGKILL this
    process as step ``kill_at`` begins (-1: never). Runs in a forked process."""
    from tfshards.training.train import train
    from tfshards.training.trainconfig import TrainConfig

    def on_batch(step: int, batch: Any) -> None:
        with open(trace, "a", encoding="utf-8") as f:
            f.write(json.dumps([step, record_ids(batch[0].numpy(), batch[1].numpy())]) + "\n")
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    train(TrainConfig(**config), on_batch=on_batch)


def _read(trace: Path) -> Run:
    if not trace.exists():
        return []
    return [tuple(json.loads(line)) for line in trace.read_text().splitlines()]  # type: ignore[misc]


def _resumed_at(died: int, per_epoch: int) -> int:
    """The step a run killed as step ``died`` began resumes at: the last save before it,
    after every ``EVERY`` steps and every epoch."""
    return max(died // EVERY * EVERY, died // per_epoch * per_epoch)


def _check(runs: list[Run], whole: list[list[str]]) -> None:
    """Every step a run took saw the uninterrupted run's batch; each run went on from the
    one before at its last save, without a gap; together they took every step."""
    steps, per_epoch = len(whole), len(whole) // EPOCHS
    for run in runs:
        assert [s for s, _ in run] == list(range(run[0][0], run[0][0] + len(run)))
        for step, ids in run:
            assert ids == whole[step], step
    assert runs[0][0][0] == 0
    for before, after in itertools.pairwise(runs):
        assert after[0][0] == _resumed_at(before[-1][0], per_epoch), (before[-1][0], after[0][0])
    assert runs[-1][-1][0] == steps - 1
    # The steps each run kept (those before the next run's start), in order: the
    # uninterrupted run's records exactly, none twice, none missed.
    kept = [ids for run, after in itertools.pairwise(runs) for s, ids in run if s < after[0][0]]
    kept += [ids for _, ids in runs[-1]]
    assert kept == whole


def _run(forker: Forker, manifest: str, tmp: Path, name: str, kill_at: int) -> Run:
    """The steps of one forked run, to its end or its SIGKILL as step ``kill_at`` begins."""
    out = tmp / ("whole" if name == "whole" else "killed")
    log, trace = tmp / f"{name}.log", tmp / f"{name}.jsonl"
    args = [_config(manifest, out), str(trace), kill_at]
    code = forker.run("test_resume:run_until", args, log=log, path=[HERE])
    assert code == (-signal.SIGKILL if kill_at >= 0 else 0), f"{name}: {log.read_text()[-3000:]}"
    return _read(trace)


def _state_bytes(folder: Path) -> int:
    """Bytes of the checkpoint besides the variables' files (``epoch-*``)."""
    return sum(p.stat().st_size for p in folder.iterdir() if not p.name.startswith("epoch-"))


@pytest.mark.slow  # 12 runs forked with TensorFlow imported, 2.2-3.5 s of CPU each: ~34 s in all
@pytest.mark.timeout(900)
def test_a_run_sigkilled_at_ten_random_steps_reads_every_batch_once_in_order(
    manifest, tmp_path, capsys
):
    forker = Forker(tmp_path / "forker.log")
    try:
        whole = [ids for _, ids in _run(forker, manifest, tmp_path, "whole", -1)]
        steps = len(whole)
        kills = sorted(random.Random(SEED).sample(range(steps), KILLS))
        with capsys.disabled():
            print(f"\nSIGKILL as steps {kills} of {steps} begin (random.Random({SEED}))")
        runs, states = [], []
        for i, kill_at in enumerate(kills):
            runs.append(_run(forker, manifest, tmp_path, f"killed-{i}", kill_at))
            if kill_at >= EVERY:  # a save came before it
                states.append(_state_bytes(tmp_path / "killed/checkpoints"))
        runs.append(_run(forker, manifest, tmp_path, "last", -1))
    finally:
        forker.close()
    assert states and max(states) <= 4096  # the input's position is one integer in state.json
    _check(runs, whole)

    parts = split(manifests.load(manifest), VAL, 0)
    records = [i for ids in whole for i in ids]
    epoch = parts.train_records
    assert steps == EPOCHS * (epoch // BATCH) and epoch % BATCH  # batches cross epochs
    side = set(records[:epoch])
    assert len(side) == epoch
    for e in range(1, len(records) // epoch):
        assert set(records[e * epoch : (e + 1) * epoch]) == side
    rest = records[len(records) // epoch * epoch :]
    assert len(set(rest)) == len(rest) and set(rest) <= side

    final = json.loads((tmp_path / "killed/metrics.json").read_text())
    reference = json.loads((tmp_path / "whole/metrics.json").read_text())
    for name in MODEL_METRICS:
        assert final[name] == pytest.approx(reference[name], abs=1e-6), name
    assert not (tmp_path / "killed/checkpoints").exists()


class _Steps:
    def __init__(self) -> None:
        self.seen: list[int] = []

    def train(self, x: Any, y: Any) -> Any:
        self.seen.append(int(x))
        return _Done()


class _Done:
    def numpy(self) -> None:
        return None


def _batches(start: int) -> Any:
    import numpy as np

    step = start
    while True:
        yield (step, np.zeros(BATCH))
        step += 1


@pytest.mark.parametrize(("done", "saves"), [(0, [4, 8]), (5, [8]), (9, []), (10, [])])
def test_an_epoch_saves_every_n_steps_but_its_last_and_starts_anywhere(done, saves):
    from tfshards.training.epochloop import EpochLoop

    steps, said = _Steps(), []
    loop = EpochLoop(steps, _batches(done), batches=10, every=4)  # type: ignore[arg-type]
    epoch, timing = loop.epoch(1, done, lambda step: said.append(step))
    assert epoch == 1 and timing.steps == 10 - done and timing.examples == BATCH * (10 - done)
    assert steps.seen == list(range(done, 10)) and said == saves
