"""`strategy: multi_worker`: two worker processes on 127.0.0.1 train through the stage script."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tfshards.listing.listing import list_files
from tfshards.project.sample import write_synthetic
from tfshards.shardset import manifest as manifests
from tfshards.shardset.split import split
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

REPO = Path(__file__).resolve().parents[2]
IMAGES, SHARDS, BATCH, EPOCHS, VAL, WORKERS = 320, 16, 16, 2, 0.25, 2
TIMEOUT = 420  # seconds a worker process may run


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> str:
    """320 synthetic 8 px PNGs of 3 classes in 16 shards; the manifest copy's path."""
    tmp = tmp_path_factory.mktemp("multiworker")
    write_synthetic(str(tmp / "raw"), IMAGES, 8, fmt="png", classes=3, workers=1)
    copy = str(tmp / "manifest.json")
    config = WriteConfig(
        out=str(tmp / "shards"), num_shards=SHARDS, executor="serial", manifest_copy=copy
    )
    write(config, list_files(str(tmp / "raw")), progress=False)
    return copy


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _command(manifest: str, out: Path, strategy: str) -> list[str]:
    return [
        sys.executable,
        "stages/train.py",
        *("--manifest", manifest, "--strategy", strategy, "--image-size", "8"),
        *("--batch-size", str(BATCH), "--epochs", str(EPOCHS), "--val-fraction", str(VAL)),
        *("--metrics", str(out / "metrics.json"), "--live-dir", str(out / "live")),
        *("--model-out", str(out / "model.keras"), "--split-out", str(out / "split.json")),
        *("--checkpoint-dir", str(out / "checkpoints"), "--checkpoint-every-steps", "4"),
    ]


def _env(trace: Path, tf_config: dict[str, Any] | None) -> dict[str, str]:
    """The environment of a run tracing to ``trace``; temporary folders beside its folder."""
    tmp = trace.parent.parent / f"{trace.parent.name}-tmp"
    tmp.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "TMPDIR": str(tmp),  # a non-chief's own folder: removed at its end, left if killed
        "TFSHARDS_TRAIN_TRACE": str(trace),
        "PYTHONPATH": str(REPO / "src"),
        "TF_NUM_INTEROP_THREADS": "1",  # 2 shared cores: keep each process's threads few
        "TF_NUM_INTRAOP_THREADS": "1",
    }
    env.pop("TF_CONFIG", None)
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return env


def _trace(path: Path) -> list[tuple[int, list[str]]]:
    return [tuple(json.loads(line)) for line in path.read_text().splitlines()]  # type: ignore[misc]


def _start_workers(manifest: str, out: Path, trace: str) -> list[subprocess.Popen[str]]:
    """Every worker's process, started together, each tracing to ``out / trace``."""
    workers = [f"127.0.0.1:{port}" for port in _free_ports(WORKERS)]
    out.mkdir(exist_ok=True)  # for the traces: a non-chief makes no folder there
    procs = []
    for index in range(WORKERS):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        procs.append(
            subprocess.Popen(
                _command(manifest, out, "multi_worker"),
                cwd=REPO,
                env=_env(out / trace, tf_config),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def _finish(procs: list[subprocess.Popen[str]]) -> list[subprocess.CompletedProcess[str]]:
    """Each process run to its end (killed at TIMEOUT, or when another failed)."""
    done = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=TIMEOUT)
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return done


def _run_workers(manifest: str, out: Path, trace: str) -> None:
    runs = _finish(_start_workers(manifest, out, trace))
    assert [r.returncode for r in runs] == [0] * WORKERS, [r.stderr[-2500:] for r in runs]


@pytest.fixture(scope="module")
def uninterrupted(manifest: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The output folder of a 2-worker run, its traces ``trace-<worker>.jsonl`` in it."""
    out = tmp_path_factory.mktemp("uninterrupted")
    _run_workers(manifest, out, "trace-{worker}.jsonl")
    return out


@pytest.mark.slow  # three processes importing TensorFlow: ~2 min on 2 shared cores
@pytest.mark.timeout(900)
def test_two_workers_read_disjoint_blocks_in_equal_steps_and_learn_as_one(
    manifest, uninterrupted, tmp_path
):
    parts = split(manifests.load(manifest), VAL, 0)
    per_worker_batch = BATCH // WORKERS
    block = parts.train_records // WORKERS  # a worker's records of every epoch
    steps = block // per_worker_batch
    # 244 train records: blocks of 122 (none left over: 244 % 2 == 0), 15 steps of 8 a
    # worker; the 2 records past the 15th batch open the worker's next epoch's batches.
    assert parts.train_records % WORKERS == 0 and block % per_worker_batch and EPOCHS == 2

    one = tmp_path / "one"
    single = subprocess.run(
        _command(manifest, one, "one"),
        cwd=REPO,
        env=_env(one / "trace.jsonl", None),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert single.returncode == 0, single.stderr[-3000:]
    train_side = {i for _, ids in _trace(one / "trace.jsonl") for i in ids}
    assert len(train_side) == parts.train_records  # 480 records read: one whole epoch in them

    out = uninterrupted
    traces = [_trace(out / f"trace-{w}.jsonl") for w in range(WORKERS)]
    for trace in traces:  # equal steps, each of its per-worker batch
        assert [s for s, _ in trace] == list(range(EPOCHS * steps))
        assert {len(ids) for _, ids in trace} == {per_worker_batch}
    streams = [[i for _, ids in trace for i in ids] for trace in traces]
    first = [stream[:block] for stream in streams]  # each worker's block of epoch 1
    second = [stream[block:] for stream in streams]  # the part of epoch 2's read
    for blocks in (first, second):
        assert all(len(b) == len(set(b)) for b in blocks)
        assert not set(blocks[0]) & set(blocks[1])
    assert set(first[0]) | set(first[1]) == train_side
    assert set(second[0]) | set(second[1]) <= train_side

    # Only the chief wrote, where both were told to; checkpoints removed at the end.
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("trace")) == [
        "live",
        "metrics.json",
        "model.keras",
        "split.json",
    ]
    metrics = json.loads((out / "metrics.json").read_text())
    reference = json.loads((one / "metrics.json").read_text())
    assert not list((out.parent / f"{out.name}-tmp").glob("tfshards-worker-*"))  # removed
    assert metrics["workers"] == WORKERS and metrics["replicas"] == WORKERS
    assert metrics["train_records"] == reference["train_records"] == parts.train_records
    assert metrics["val_accuracy"] > 1 / 3 + 0.1  # 3 classes: above chance
    assert metrics["val_accuracy"] == pytest.approx(reference["val_accuracy"], abs=0.05)


@pytest.mark.slow  # four processes importing TensorFlow: ~1.5 min on 2 shared cores
@pytest.mark.timeout(900)
def test_two_workers_killed_mid_epoch_resume_at_the_chiefs_checkpointed_step(
    manifest, uninterrupted, tmp_path
):
    whole = [dict(_trace(uninterrupted / f"trace-{w}.jsonl")) for w in range(WORKERS)]
    out = tmp_path / "killed"
    procs = _start_workers(manifest, out, "killed-{worker}.jsonl")
    try:  # SIGKILL both once the chief is in step 6: the save after step 4 is done
        deadline = time.monotonic() + TIMEOUT
        trace = out / "killed-0.jsonl"
        while not (trace.exists() and len(trace.read_text().splitlines()) > 6):
            assert all(p.poll() is None for p in procs), "a worker ended before the kill"
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()
    state = json.loads((out / "checkpoints/state.json").read_text())
    resumed_at = state["step"]
    per_epoch = len(whole[0]) // EPOCHS  # saves: every 4 steps and at each epoch's end
    assert 4 <= resumed_at < len(whole[0])
    assert resumed_at % 4 == 0 or resumed_at % per_epoch == 0

    _run_workers(manifest, out, "resumed-{worker}.jsonl")
    for w in range(WORKERS):
        resumed = _trace(out / f"resumed-{w}.jsonl")
        assert [s for s, _ in resumed] == list(range(resumed_at, len(whole[w])))
        assert all(ids == whole[w][s] for s, ids in resumed), w
    assert not (out / "checkpoints").exists()
    metrics = json.loads((out / "metrics.json").read_text())
    reference = json.loads((uninterrupted / "metrics.json").read_text())
    for name in ("loss", "accuracy", "val_loss", "val_accuracy"):
        assert metrics[name] == pytest.approx(reference[name], abs=1e-5), name
