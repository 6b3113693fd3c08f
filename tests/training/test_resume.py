"""A run killed mid-epoch resumes at its last checkpointed step: each batch as uninterrupted."""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tfshards.listing.listing import list_files
from tfshards.project.sample import write_synthetic
from tfshards.training.history import MODEL_METRICS
from tfshards.training.train import train
from tfshards.training.trainconfig import TrainConfig
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

IMAGES, SHARDS, BATCH, EPOCHS, EVERY = 300, 6, 16, 3, 4


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> str:
    """300 synthetic 8 px PNGs in 6 shards; the manifest copy's path."""
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
        "image_size": 8,
        "batch_size": BATCH,
        "epochs": EPOCHS,
        "val_fraction": 0.34,
        "checkpoint_every_steps": EVERY,
        "metrics": str(out / "metrics.json"),
        "live_dir": None,
        "model_out": None,
        "split_out": None,
        "checkpoint_dir": str(out / "checkpoints"),
    }


def batch_ids(batch: Any) -> list[str]:
    """Each record of a batch named by its pixels and label."""
    images, labels = batch[0].numpy(), batch[1].numpy()
    return [
        hashlib.sha256(x.tobytes() + bytes([int(y)])).hexdigest()[:12]
        for x, y in zip(images, labels, strict=True)
    ]


class Crash(Exception):
    pass


def _reference(manifest: str, out: Path) -> tuple[dict[int, list[str]], dict[str, Any]]:
    seen: dict[int, list[str]] = {}
    config = {**_config(manifest, out), "checkpoint_dir": None}
    result = train(TrainConfig(**config), on_batch=lambda s, b: seen.setdefault(s, batch_ids(b)))
    return seen, result.metrics


def _check(runs: list[list[tuple[int, list[str]]]], whole: dict[int, list[str]]) -> None:
    """Every step any run took saw the uninterrupted run's batch; each run went on from the
    one before without a gap; together they took every step."""
    steps = len(whole)
    for run in runs:
        for step, ids in run:
            assert ids == whole[step], step
        assert [s for s, _ in run] == list(range(run[0][0], run[0][0] + len(run)))
    for before, after in itertools.pairwise(runs):
        # a run starts at the last checkpoint before the step it died at: an epoch's end or
        # a multiple of EVERY, never later (a miss) and never further back (a needless replay)
        died = before[-1][0]
        assert after[0][0] == died // EVERY * EVERY or after[0][0] % (steps // EPOCHS) == 0
        assert died - EVERY < after[0][0] <= died
    assert {s for run in runs for s, _ in run} == set(range(steps))
    assert runs[-1][-1][0] == steps - 1


@pytest.mark.slow  # six training runs: ~100 s on 2 shared cores
def test_a_run_crashed_mid_epoch_resumes_at_its_last_checkpointed_step(manifest, tmp_path):
    whole, metrics = _reference(manifest, tmp_path / "whole")
    steps = len(whole)
    assert steps % EPOCHS == 0 and steps // EPOCHS > EVERY + 2
    config = TrainConfig(**_config(manifest, tmp_path / "crashed"))
    runs: list[list[tuple[int, list[str]]]] = []
    for crash_at in (6, 7, steps // EPOCHS + 1, steps - 2, -1):
        run: list[tuple[int, list[str]]] = []

        def on_batch(step: int, batch: Any, run=run, crash_at=crash_at) -> None:
            run.append((step, batch_ids(batch)))
            if step == crash_at:
                raise Crash

        runs.append(run)
        try:
            result = train(config, on_batch=on_batch)
        except Crash:
            state = tmp_path / "crashed/checkpoints/state.json"
            assert state.stat().st_size < 4096  # the input's position: one integer
            continue
    _check(runs, whole)
    for name in MODEL_METRICS:
        assert result.metrics[name] == pytest.approx(metrics[name], abs=1e-6), name
    assert not (tmp_path / "crashed/checkpoints").exists()


KILLED = """
import json, os, signal, sys
from tfshards.training.train import train
from tfshards.training.trainconfig import TrainConfig
sys.path.insert(0, sys.argv[4])
from test_resume import batch_ids

config, trace, kill_at = eval(sys.argv[1]), sys.argv[2], int(sys.argv[3])

def on_batch(step, batch):
    with open(trace, "a") as f:
        f.write(json.dumps([step, batch_ids(batch)]) + "\\n")
    if step == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

train(TrainConfig(**config), on_batch=on_batch)
"""


@pytest.mark.slow  # five processes importing TensorFlow
def test_a_run_sigkilled_at_random_steps_sees_every_batch_once(manifest, tmp_path):
    whole, metrics = _reference(manifest, tmp_path / "whole")
    steps = len(whole)
    kills = sorted(random.Random(7).sample(range(1, steps - 1), 3))
    config = _config(manifest, tmp_path / "killed")
    runs = []
    here = str(Path(__file__).parent)
    for i, kill_at in enumerate([*kills, -1]):
        trace = tmp_path / f"trace-{i}.jsonl"
        done = subprocess.run(
            [sys.executable, "-c", KILLED, repr(config), str(trace), str(kill_at), here],
            capture_output=True,
            text=True,
            timeout=300,
        )
        expected = -signal.SIGKILL if kill_at >= 0 else 0
        assert done.returncode == expected, done.stderr[-3000:]
        runs.append([tuple(json.loads(line)) for line in trace.read_text().splitlines()])
    _check(runs, whole)
    final = json.loads((tmp_path / "killed/metrics.json").read_text())
    for name in MODEL_METRICS:
        assert final[name] == pytest.approx(metrics[name], abs=1e-6), name


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
