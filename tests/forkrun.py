"""Test processes forked from one that imported TensorFlow once.

A fresh Python process spends ~4.3 s of CPU importing TensorFlow before its
first step; a test that starts a dozen runs (each killed, then restarted)
pays that a dozen times. :class:`Forker` starts one process that imports
TensorFlow and the train stage's modules, and forks each run from it: a run
is still a process of its own (its own TensorFlow runtime, killed by SIGKILL
like any), but costs only its own work. Importing TensorFlow starts no thread
of its own (only OpenBLAS's idle servers, which are fork-safe), and the
forking process never runs a TensorFlow op, so each fork starts as clean as
a new process. Measured on 2 shared cores: a killed 8 px run of
``tests/training/test_resume.py`` costs 2.2-3.5 s of CPU forked; the 10-kill
test 34 s of CPU in all, where the 3-kill one it replaced took 45 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

_SERVER = r"""
import importlib, json, os, resource, signal, sys, tempfile, traceback

from tfshards import heavyimport

heavyimport.own_process()  # frozen: no fork's collector walks them again
heavyimport.load(*json.loads(sys.argv[1]))
usage = resource.getrusage(resource.RUSAGE_SELF)
print(f"imported in {usage.ru_utime + usage.ru_stime:.2f} s of CPU", file=sys.stderr, flush=True)
ended = {}  # pid: exit status of each run reaped and not yet waited for


def child(req):
    signal.alarm(req["timeout"])  # a hung run dies (SIGALRM), it does not hang the test
    log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ.clear()
    os.environ.update(req["env"])
    tempfile.tempdir = None  # read TMPDIR again
    os.chdir(req["cwd"])
    sys.path[:0] = req["path"]
    code = 1
    try:
        module, function = req["call"].split(":")
        getattr(importlib.import_module(module), function)(*req["args"])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def reap(pid, status, usage):
    ended[pid] = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    print(f"run {pid} ended {ended[pid]} after {cpu:.2f} s of CPU", file=sys.stderr, flush=True)


def wait(pids):
    while True:
        if any(ended.get(p, 0) != 0 for p in pids):  # its peers would wait for it forever
            for p in pids:
                if p not in ended:
                    os.kill(p, signal.SIGKILL)  # not reaped yet: still this run's pid
        if all(p in ended for p in pids):
            return [ended.pop(p) for p in pids]
        reap(*os.wait4(-1, 0))


def poll(pids):
    for p in pids:
        if p not in ended:
            pid, status, usage = os.wait4(p, os.WNOHANG)
            if pid:
                reap(pid, status, usage)
    return [ended.get(p) for p in pids]


for line in sys.stdin:
    req = json.loads(line)
    if "wait" in req:
        reply = {"codes": wait(req["wait"])}
    elif "poll" in req:
        reply = {"codes": poll(req["poll"])}
    else:
        pid = os.fork()
        if pid == 0:
            child(req)
        reply = {"pid": pid}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
"""

PRELOAD = ("tensorflow", "keras", "tfshards.training.train", "tfshards.cli.train")


class Forker:
    """One process with TensorFlow imported; :meth:`start` forks a run of a function.

    Args:
        log: the forking process's own stderr.
        preload: modules imported once, before any fork.
    """

    def __init__(self, log: Path, preload: Sequence[str] = PRELOAD) -> None:
        self._log = open(log, "ab")  # noqa: SIM115  (closed by close())
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests")]),
        }
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER, json.dumps(list(preload))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            text=True,
        )

    def start(
        self,
        call: str,
        args: Sequence[Any],
        *,
        log: Path,
        env: dict[str, str] | None = None,
        cwd: Path = REPO,
        path: Sequence[str] = (),
        timeout: int = 300,
    ) -> int:
        """Fork a process that runs ``module:function(*args)`` (``module`` found on
        ``path``) with ``env`` (default: this one's) in ``cwd``, its output to ``log``,
        killed after ``timeout`` seconds; its pid."""
        env = dict(os.environ if env is None else env)
        request = {
            "call": call,
            "args": list(args),
            "log": str(log),
            "env": env,
            "cwd": str(cwd),
            "path": list(path),
            "timeout": timeout,
        }
        return int(self._ask(request)["pid"])

    def wait(self, pids: Sequence[int]) -> list[int]:
        """Each run's exit status (``-signal`` when killed); the others are killed
        as soon as one fails."""
        return [int(code) for code in self._ask({"wait": list(pids)})["codes"]]

    def poll(self, pids: Sequence[int]) -> list[int | None]:
        """Each run's exit status, None while it runs; :meth:`wait` still returns it."""
        return [
            None if code is None else int(code) for code in self._ask({"poll": list(pids)})["codes"]
        ]

    def run(self, call: str, args: Sequence[Any], **options: Any) -> int:
        """:meth:`start` then :meth:`wait`: the run's exit status."""
        return self.wait([self.start(call, args, **options)])[0]

    def close(self) -> None:
        """End the forking process (its runs all waited for)."""
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._log.close()

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(
                f"the forking process ended ({self._proc.wait()}); see {self._log.name}"
            )
        reply: dict[str, Any] = json.loads(line)
        return reply
