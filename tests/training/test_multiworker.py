"""`strategy: multi_worker`: 2 and 3 worker processes on 127.0.0.1 train via the stage script."""

from __future__ import annotations

import json
import os
import random
import runpy
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from forkrun import REPO, Forker
from tfshards.listing.listing import list_files
from tfshards.project.sample import write_synthetic
from tfshards.shardset import manifest as manifests
from tfshards.shardset.split import split
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

# 16 training shards (of 19) and 264 training records: a block of 132 records a worker
# for 2 workers, 88 for 3 (none left over); 14 steps a worker of 9 or 6 records, the
# 6 or 4 records past its 14th batch opening its next epoch's first batch.
IMAGES, SHARDS, BATCH, EPOCHS, VAL = 320, 19, 18, 2, 0.2
TIMEOUT = 420  # seconds a worker process may run
HERE = str(Path(__file__).parent)
Trace = list[tuple[int, list[str]]]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> str:
    """320 synthetic 8 px PNGs of 3 classes in 19 shards; the manifest copy's path."""
    tmp = tmp_path_factory.mktemp("multiworker")
    write_synthetic(str(tmp / "raw"), IMAGES, 8, fmt="png", classes=3, workers=1)
    copy = str(tmp / "manifest.json")
    config = WriteConfig(
        out=str(tmp / "shards"), num_shards=SHARDS, executor="serial", manifest_copy=copy
    )
    write(config, list_files(str(tmp / "raw")), progress=False)
    return copy


@pytest.fixture(scope="module")
def forker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forker]:
    """Every worker process forked from one that imported TensorFlow once."""
    forks = Forker(tmp_path_factory.mktemp("forker") / "forker.log")
    yield forks
    forks.close()


def stage(argv: list[str]) -> None:
    """``python stages/train.py ARGV``, in a forked process."""
    sys.argv = ["stages/train.py", *argv]
    runpy.run_path(str(REPO / "stages/train.py"), run_name="__main__")


def _free_ports(count: int) -> list[int]:
    """``count`` ports free now, below the ephemeral range (where port 0 and outgoing
    connections take theirs); one may still be taken before its worker binds it, so
    :func:`_run_workers` starts over on new ports when a worker cannot bind."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            low = int(f.read().split()[0])
    except OSError:
        low = 32768
    ports: list[int] = []
    while len(ports) < count:
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if port not in ports:
            ports.append(port)
    return ports


def _argv(manifest: str, out: Path, strategy: str) -> list[str]:
    return [
        *("--manifest", manifest, "--strategy", strategy, "--image-size", "8"),
        *("--model", "tinymodel:tiny_model"),  # 3.6 s of CPU a worker, small_cnn's 7 s
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
        "TF_NUM_INTEROP_THREADS": "1",  # 2 shared cores: keep each process's threads few
        "TF_NUM_INTRAOP_THREADS": "1",
    }
    env.pop("TF_CONFIG", None)
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return env


def _trace(path: Path) -> Trace:
    return [tuple(json.loads(line)) for line in path.read_text().splitlines()]  # type: ignore[misc]


def _log(out: Path, name: str) -> Path:
    """Where a process's output goes: beside ``out``, whose files the tests list."""
    logs = out.parent / f"{out.name}-logs"
    logs.mkdir(exist_ok=True)
    return logs / f"{name}.log"


def _start_workers(
    forker: Forker, manifest: str, out: Path, trace: str, count: int
) -> tuple[list[int], list[Path]]:
    """Every worker's process, started together, each tracing to ``out / trace``."""
    workers = [f"127.0.0.1:{port}" for port in _free_ports(count)]
    out.mkdir(exist_ok=True)  # for the traces: a non-chief makes no folder there
    pids, logs = [], []
    for index in range(count):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        logs.append(_log(out, Path(trace.format(worker=index)).stem))
        pids.append(
            forker.start(
                "test_multiworker:stage",
                [_argv(manifest, out, "multi_worker")],
                log=logs[-1],
                env=_env(out / trace, tf_config),
                path=[HERE],
                timeout=TIMEOUT,
            )
        )
    return pids, logs


def _bind_failed(logs: list[Path], out: Path, trace: str) -> bool:
    """True when a worker could not bind its port (taken since :func:`_free_ports`): then
    its logs and traces are removed for a start on new ports."""
    if not any("Could not start gRPC server" in log.read_text() for log in logs):
        return False
    for path in [*logs, *out.glob(trace.format(worker="*"))]:
        path.unlink()
    return True


def _run_workers(forker: Forker, manifest: str, out: Path, trace: str, count: int) -> None:
    """Run ``count`` workers to their end; on new ports when one could not bind its own."""
    for _ in range(3):
        pids, logs = _start_workers(forker, manifest, out, trace, count)
        codes = forker.wait(pids)  # a failed worker's peers are killed at once: no hang
        if codes == [0] * count:
            return
        tails = [log.read_text()[-2500:] for log in logs]
        if not _bind_failed(logs, out, trace):
            break
    pytest.fail(f"workers ended {codes}: {tails}")


def _kill_in_step(forker: Forker, manifest: str, out: Path, count: int, step: int) -> None:
    """Start ``count`` workers, SIGKILL all as the chief begins step ``step``."""
    trace = "killed-{worker}.jsonl"
    for _ in range(3):
        pids, logs = _start_workers(forker, manifest, out, trace, count)
        chief = out / trace.format(worker=0)
        deadline = time.monotonic() + TIMEOUT
        reached, codes = False, forker.poll(pids)
        while all(c is None for c in codes) and time.monotonic() < deadline:
            reached = chief.exists() and len(chief.read_text().splitlines()) > step
            if reached:
                break
            time.sleep(0.05)
            codes = forker.poll(pids)
        for pid, code in zip(pids, codes, strict=True):
            if code is None:  # not reaped: still that worker's pid
                os.kill(pid, signal.SIGKILL)
        codes = forker.wait(pids)
        if reached and codes == [-signal.SIGKILL] * count:
            return
        tails = [log.read_text()[-2500:] for log in logs]
        if not _bind_failed(logs, out, trace):
            break
    pytest.fail(f"workers ended {codes}, the chief in step {step} or not: {tails}")


@pytest.fixture(scope="module")
def single(
    manifest: str, forker: Forker, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, set[str]]:
    """A one-worker run's output folder, and the records of the training side it read."""
    one = tmp_path_factory.mktemp("one")
    code = forker.run(
        "test_multiworker:stage",
        [_argv(manifest, one, "one")],
        log=_log(one, "one"),
        env=_env(one / "trace.jsonl", None),
        path=[HERE],
        timeout=TIMEOUT,
    )
    assert code == 0, _log(one, "one").read_text()[-3000:]
    train_side = {i for _, ids in _trace(one / "trace.jsonl") for i in ids}
    assert len(train_side) == split(manifests.load(manifest), VAL, 0).train_records
    return one, train_side


@pytest.fixture(scope="module")
def uninterrupted(
    manifest: str, forker: Forker, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[int], Path]:
    """The output folder of a ``count``-worker run (made once), its traces
    ``trace-<worker>.jsonl`` in it."""
    runs: dict[int, Path] = {}

    def run(count: int) -> Path:
        if count not in runs:
            out = tmp_path_factory.mktemp(f"workers-{count}")
            _run_workers(forker, manifest, out, "trace-{worker}.jsonl", count)
            runs[count] = out
        return runs[count]

    return run


@pytest.mark.slow  # 1 + 3, then 2 processes forked, 4-6 s of CPU each (the module: ~55 s)
@pytest.mark.timeout(900)
@pytest.mark.parametrize("count", [3, 2])
def test_workers_read_disjoint_blocks_in_equal_steps_and_learn_as_one(
    manifest, single, uninterrupted, count
):
    parts = split(manifests.load(manifest), VAL, 0)
    per_worker_batch = BATCH // count
    block = parts.train_records // count  # a worker's records of every epoch
    steps = block // per_worker_batch
    assert len(parts.train) == 16 and parts.train_records % count == 0
    assert block % per_worker_batch and EPOCHS == 2  # batches cross the epochs

    one, train_side = single
    out = uninterrupted(count)
    traces = [_trace(out / f"trace-{w}.jsonl") for w in range(count)]
    for trace in traces:  # equal steps, each of its per-worker batch
        assert [s for s, _ in trace] == list(range(EPOCHS * steps))
        assert {len(ids) for _, ids in trace} == {per_worker_batch}
    streams = [[i for _, ids in trace for i in ids] for trace in traces]
    first = [stream[:block] for stream in streams]  # each worker's block of epoch 1
    second = [stream[block:] for stream in streams]  # the part of epoch 2's read
    for blocks in (first, second):
        assert all(len(b) == len(set(b)) for b in blocks)
        assert sum(len(b) for b in blocks) == len(set().union(*blocks))  # disjoint
    assert set().union(*first) == train_side
    assert set().union(*second) <= train_side

    # Only the chief wrote, where all were told to; checkpoints removed at the end.
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("trace")) == [
        "live",
        "metrics.json",
        "model.keras",
        "split.json",
    ]
    metrics = json.loads((out / "metrics.json").read_text())
    reference = json.loads((one / "metrics.json").read_text())
    assert not list((out.parent / f"{out.name}-tmp").glob("tfshards-worker-*"))  # removed
    assert metrics["workers"] == count and metrics["replicas"] == count
    assert metrics["train_records"] == reference["train_records"] == parts.train_records
    assert metrics["val_accuracy"] > 1 / 3 + 0.1  # 3 classes: above chance
    assert metrics["val_accuracy"] == pytest.approx(reference["val_accuracy"], abs=0.05)


@pytest.mark.slow  # 4 processes forked with TensorFlow imported, 3.5-5 s of CPU each
@pytest.mark.timeout(900)
def test_two_workers_killed_mid_epoch_resume_at_the_chiefs_checkpointed_step(
    manifest, forker, uninterrupted, tmp_path
):
    workers = 2
    reference_out = uninterrupted(workers)
    whole = [dict(_trace(reference_out / f"trace-{w}.jsonl")) for w in range(workers)]
    out = tmp_path / "killed"
    _kill_in_step(forker, manifest, out, workers, 6)  # the save after step 4 is done
    state = json.loads((out / "checkpoints/state.json").read_text())
    resumed_at = state["step"]
    per_epoch = len(whole[0]) // EPOCHS  # saves: every 4 steps and at each epoch's end
    assert 4 <= resumed_at < len(whole[0])
    assert resumed_at % 4 == 0 or resumed_at % per_epoch == 0

    _run_workers(forker, manifest, out, "resumed-{worker}.jsonl", workers)
    for w in range(workers):
        resumed = _trace(out / f"resumed-{w}.jsonl")
        assert [s for s, _ in resumed] == list(range(resumed_at, len(whole[w])))
        assert all(ids == whole[w][s] for s, ids in resumed), w
    assert not (out / "checkpoints").exists()
    metrics = json.loads((out / "metrics.json").read_text())
    reference = json.loads((reference_out / "metrics.json").read_text())
    for name in ("loss", "accuracy", "val_loss", "val_accuracy"):
        assert metrics[name] == pytest.approx(reference[name], abs=1e-5), name
