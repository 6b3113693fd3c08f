"""The executor: which start method a pool gets, what its workers import, dead workers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tfshards import executor
from tfshards.errors import ConfigError, ShardError

REPO = Path(__file__).resolve().parents[1]


def _kill_self(_: int) -> int:
    os.kill(os.getpid(), 9)
    return 0


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
    with pytest.raises(ShardError, match=r"a worker process died .* while working on task-7"):
        list(
            executor.run(
                _kill_self, [7], executor="process", workers=2, describe=lambda t: f"task-{t}"
            )
        )


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
