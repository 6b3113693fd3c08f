"""Worker start methods: fork only when safe, and forkserver workers that skip ``__main__``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tfshards import mpcontext

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("setup", "method"),
    [
        ("", "fork"),
        ("threading.Thread(target=threading.Event().wait, daemon=True).start()", "forkserver"),
    ],
)
def test_a_fresh_parent_forks_unless_it_has_threads(setup, method):
    code = f"import threading\n{setup}\nfrom tfshards import mpcontext\n"
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

            from tfshards import executor, mpcontext

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
