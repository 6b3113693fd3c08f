"""Worker start methods: fork only when safe, and forkserver workers that skip ``__main__``."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from tfshards.run import mpcontext

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("setup", "method"),
    [
        ("", "fork"),
        ("threading.Thread(target=threading.Event().wait, daemon=True).start()", "forkserver"),
    ],
)
def test_a_fresh_parent_forks_unless_it_has_threads(setup, method):
    code = f"import threading\n{setup}\nfrom tfshards.run import mpcontext\n"
    code += "print(mpcontext.mp_context().get_start_method())"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.stdout.strip() == method, out.stderr


def test_a_parent_with_threads_gets_the_lean_forkserver():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert isinstance(mpcontext.mp_context(), mpcontext.LeanForkServerContext)
    finally:
        stop.set()
        thread.join()


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

            from tfshards.run import executor, mpcontext

            if __name__ == "__main__":
                threading.Thread(target=threading.Event().wait, daemon=True).start()
                print(type(mpcontext.mp_context()).__name__)
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


# ------------------------------------------------------------------ workers die with their parent

BLOCK_TRANSFORM = """
import time

def block(path, data, label):
    time.sleep(3600)  # a shard that never ends: the parent is killed mid-write
    return {}
"""

# Each script starts worker processes and then never ends on its own.
ORPHAN_SCRIPTS = {
    "process pool, fork": """
        from tfshards.run import executor
        list(executor.run(time.sleep, [3600.0] * 4, executor="process", workers=3))
    """,
    "process pool, forkserver (a parent with threads)": """
        threading.Thread(target=threading.Event().wait, daemon=True).start()
        from tfshards.run import executor
        list(executor.run(time.sleep, [3600.0] * 4, executor="process", workers=3))
    """,
    "process pool, fork, polling getppid() (no PR_SET_PDEATHSIG: not Linux)": """
        from tfshards.run import executor, mpcontext
        mpcontext._set_parent_death_signal = lambda: False  # fork: the workers inherit this
        list(executor.run(time.sleep, [3600.0] * 4, executor="process", workers=3))
    """,
    "from_files processes (idle workers)": """
        from tfshards.reading.pools import Leaf, Runner
        runner = Runner("process", abs, [Leaf("int64", (), "")], 2)
        threading.Event().wait()
    """,
    "sample": """
        from tfshards.project.sample import write_synthetic
        write_synthetic(sys.argv[1], 1_000_000, 32, workers=3, progress=False)
    """,
}


def _descendants(pid: int, at_least: int) -> list[psutil.Process]:
    """The process tree under ``pid`` once it has ``at_least`` processes (60 s at most)."""
    parent = psutil.Process(pid)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = parent.children(recursive=True)
        if len(found) >= at_least:
            return found
        time.sleep(0.05)
    raise AssertionError(f"expected {at_least} worker processes, found {len(found)}")


def _running(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def _orphans_after_killing(argv: list[str], workers: int, cwd: Path) -> list[psutil.Process]:
    """SIGKILL the process ``argv`` starts (not its workers); what is still running 10 s later."""
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{cwd}"}
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        workers_seen = _descendants(proc.pid, workers)
    except AssertionError:  # too few workers: the parent, left running, would block for good
        with contextlib.suppress(psutil.NoSuchProcess):
            for p in psutil.Process(proc.pid).children(recursive=True):
                p.kill()
        proc.kill()
        proc.communicate()
        raise
    try:
        proc.kill()  # the parent alone, as the OOM killer does
        proc.wait()
        deadline = time.monotonic() + 10
        while _running(workers_seen) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _running(workers_seen)
        if not left:  # nobody holds the caller's pipes any more: reading them ends
            proc.communicate(timeout=10)
        return left
    finally:
        for p in _running(workers_seen):  # only the processes this test started
            p.kill()


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(ORPHAN_SCRIPTS))
def test_workers_exit_when_their_parent_is_killed(case, tmp_path):
    script = tmp_path / "parent.py"
    body = textwrap.indent(textwrap.dedent(ORPHAN_SCRIPTS[case]), "    ")
    script.write_text(f"import sys, threading, time\n\nif __name__ == '__main__':\n{body}")
    argv = [sys.executable, str(script), str(tmp_path / "out")]
    assert _orphans_after_killing(argv, workers=2, cwd=tmp_path) == []


@pytest.mark.slow
def test_a_killed_write_command_leaves_no_worker_behind(tmp_path):
    from tfshards.listing.listing import list_files, write_listing
    from tfshards.project.sample import write_synthetic

    write_synthetic(str(tmp_path / "raw"), 24, 16, workers=1)
    write_listing(list_files(str(tmp_path / "raw")), str(tmp_path / "listing"))
    (tmp_path / "tx_block.py").write_text(BLOCK_TRANSFORM)
    argv = [sys.executable, "-m", "tfshards", "write", str(tmp_path / "listing")]
    argv += ["--out", "out", "--num-shards", "4", "--transform", "tx_block:block"]
    argv += ["--executor", "process", "--workers", "3", "--no-progress"]
    assert _orphans_after_killing(argv, workers=2, cwd=tmp_path) == []


@pytest.mark.slow
def test_a_killed_write_with_a_forkserver_leaves_no_worker_or_server_behind(tmp_path):
    """A parent with threads (s3fs's I/O loop; here a sitecustomize's) gets a forkserver,
    whose workers each hold its "alive" pipe: server and worker outlived a SIGKILLed
    write for good, holding its stdout."""
    from tfshards.listing.listing import list_files, write_listing
    from tfshards.project.sample import write_synthetic

    write_synthetic(str(tmp_path / "raw"), 24, 16, workers=1)
    write_listing(list_files(str(tmp_path / "raw")), str(tmp_path / "listing"))
    (tmp_path / "sitecustomize.py").write_text(  # a thread before tfshards starts
        "import threading\nthreading.Thread(target=threading.Event().wait, daemon=True).start()\n"
    )
    (tmp_path / "tx_block.py").write_text(BLOCK_TRANSFORM)
    argv = [sys.executable, "-m", "tfshards", "write", str(tmp_path / "listing")]
    argv += ["--out", "out", "--num-shards", "4", "--transform", "tx_block:block"]
    argv += ["--executor", "process", "--workers", "2", "--no-progress"]
    # the server, the resource tracker and a worker
    assert _orphans_after_killing(argv, workers=3, cwd=tmp_path) == []
