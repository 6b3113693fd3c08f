"""The executor: which start method a pool gets, what its workers import, dead workers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tfshards import executor
from tfshards.errors import ConfigError, ShardError

REPO = Path(__file__).resolve().parents[1]


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


def test_a_parent_with_threads_gets_the_lean_forkserver():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert isinstance(executor.mp_context(), executor.LeanForkServerContext)
    finally:
        stop.set()
        thread.join()


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


def test_memory_storage_refuses_processes():
    with pytest.raises(ConfigError, match="memory:// lives in one process"):
        executor.resolve("process", 2, ["file", "memory"])
    assert executor.resolve("auto", 2, ["memory"]) == "thread"


@pytest.mark.slow
def test_forkserver_workers_do_not_rerun_the_script_that_started_them(tmp_path):
    """A user's script that imports TensorFlow at the top must not make every worker import it."""
    log = tmp_path / "imports.log"
    script = tmp_path / "user_script.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, threading
            with open({str(log)!r}, "a") as f:  # what `import tensorflow` would cost, made visible
                f.write(f"{{os.getpid()}}\\n")

            from tfshards import executor

            if __name__ == "__main__":
                threading.Thread(target=threading.Event().wait, daemon=True).start()
                print(type(executor.mp_context()).__name__)
                done = dict(executor.run(abs, [-1, -2, -3, -4],
                                         executor="process", workers=2))
                assert done == {{0: 1, 1: 2, 2: 3, 3: 4}}, done
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "LeanForkServerContext"
    assert len(log.read_text().split()) == 1  # the parent alone ran the script
