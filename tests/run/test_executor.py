"""Executors: results by task index, the caller as a worker, dead workers, memory://, names."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tfshards.errors import ConfigError, ShardError
from tfshards.run import executor
from tfshards.run.executor import Needs, RunOptions


def _die_in_a_worker(parent: int) -> int:
    if os.getpid() == parent:  # the calling process takes tasks too: spare it, and be slow
        time.sleep(0.2)
    else:
        os.kill(os.getpid(), 9)
    return 0


def _pid_after(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def test_results_come_back_with_their_task_index():
    for kind in ("serial", "thread", "process"):
        got = dict(executor.run(abs, [-3, -1, -2], executor=kind, workers=2))
        assert got == {0: 3, 1: 1, 2: 2}, kind


def test_a_killed_worker_is_a_shard_error_naming_its_task():
    tasks = [os.getpid()] * 6
    with pytest.raises(ShardError, match=r"a worker process died .* while working on task-"):
        list(
            executor.run(
                _die_in_a_worker,
                tasks,
                executor="process",
                workers=2,
                describe=lambda t: f"task-{t}",
            )
        )


@pytest.mark.parametrize("kind", ["process", "thread"])
def test_the_calling_process_is_one_of_the_workers(kind):
    done = dict(executor.run(_pid_after, [0.05] * 8, executor=kind, workers=2))
    assert sorted(done) == list(range(8))
    if kind == "process":
        pids = set(done.values())
        assert os.getpid() in pids and len(pids) == 2  # one process started, not two


def test_with_the_users_code_the_calling_process_only_hands_tasks_out():
    options = RunOptions(2, "process")
    with executor.start(options, user_code=True) as pool:
        done = dict(pool.map(_pid_after, [0.05] * 8))
    assert sorted(done) == list(range(8))
    pids = set(done.values())
    assert os.getpid() not in pids and len(pids) == 2  # two workers, as asked


@pytest.mark.slow
def test_a_transform_that_kills_its_process_is_one_line_not_the_end_of_the_command(tmp_path):
    """A segfaulting decoder or the OOM killer in the user's transform: when the command's
    own process took that task, the command died without a word (exit -9)."""
    from tfshards.listing.listing import list_files, write_listing
    from tfshards.project.sample import write_synthetic

    write_synthetic(str(tmp_path / "raw"), 12, 16, workers=1)
    write_listing(list_files(str(tmp_path / "raw")), str(tmp_path / "listing"))
    (tmp_path / "killer.py").write_text(
        "import os, signal\n"
        "def features(path, data, label):\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    argv = [sys.executable, "-m", "tfshards", "write", "listing", "--out", "out"]
    # 6 shards: the pool holds 2 at a time, the command's own process took the last
    argv += ["--num-shards", "6", "--transform", "killer:features", "--executor", "process"]
    done = subprocess.run(
        [*argv, "--workers", "2", "--no-progress"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert done.stderr.startswith("error: a worker process died (killed by a signal or out of")
    assert done.stderr.count("\n") == 1 and "while working on data-0000" in done.stderr


def test_memory_storage_refuses_processes():
    with pytest.raises(ConfigError, match="memory:// lives in one process"):
        executor.resolve("process", 2, ["file", "memory"])
    assert executor.resolve("auto", 2, ["memory"]) == "thread"


@pytest.mark.parametrize(("old", "new"), [("processes", "process"), ("threads", "thread")])
def test_old_spellings_still_work_with_a_deprecation_warning(old, new):
    with pytest.warns(DeprecationWarning, match=f"executor '{old}' is deprecated; use '{new}'"):
        assert RunOptions(2, old).executor == new
    with pytest.warns(DeprecationWarning):
        assert executor.resolve(old, 2, ["file"]) == new


def test_run_options_refuse_an_unknown_executor_and_zero_workers():
    with pytest.raises(
        ConfigError,
        match=r"executor must be one of \('auto', 'dask', 'process', 'serial', 'thread'\)",
    ):
        RunOptions(2, "ray")
    with pytest.raises(ConfigError, match="workers must be >= 1, got 0"):
        RunOptions(0, "thread")


def test_an_executor_is_never_wider_than_its_tasks():
    started = executor.start(RunOptions(8, "process"), ["file"], tasks=3)
    assert (started.name, started.options.workers) == ("process", 3)
    assert executor.start(RunOptions(8), ["file"], tasks=1).name == "serial"


def test_shared_fs_of_the_run_options_reaches_the_dask_checks():
    needs = Needs(locations=("/data/raw",))
    refused = executor.start(RunOptions(2, "dask", "tcp://10.0.0.5:8786"), ["file"])
    with pytest.raises(ConfigError, match="/data/raw: a local path with the Dask scheduler"):
        list(refused.map(str, ["task"], needs=needs))


def test_the_built_in_executors_are_imported_on_first_use():
    code = (
        "import sys\n"
        "from tfshards.run import executor\n"
        "executor.RunOptions(4, 'process')\n"
        "assert executor.resolve('auto', 4, ['file']) == 'process'\n"
        "assert not {'tfshards.run.localexec', 'tfshards.run.cluster'} & set(sys.modules)\n"
        "assert executor.executor_class('dask').__module__ == 'tfshards.run.cluster'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
