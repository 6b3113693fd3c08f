"""A real Dask cluster, as a user starts one: `dask scheduler` and `dask worker` processes.

The scheduler and its two worker processes run on 127.0.0.1 on free ports, in
another working directory than the CLI, with S3 credentials for a moto server
in their environment. The workers run the pure-Python loops
(``TFSHARDS_PURE_PYTHON=1``) whatever this process runs, as workers built
without a C compiler would. The CLI reaches them with ``--dask-address``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfshards.format import native
from tfshards.project.sample import write_synthetic
from tfshards.run import cluster
from tfshards.shardset.manifest import Manifest

pytestmark = pytest.mark.slow
DASK = str(Path(sys.executable).parent / "dask")
CLI = (sys.executable, "-m", "tfshards")


@pytest.fixture(scope="module")
def s3_env(_moto_server: str) -> dict[str, str]:
    """Environment that points fsspec's S3 at a moto server on 127.0.0.1 (the workers' too)."""
    return {
        **os.environ,
        "FSSPEC_S3_ENDPOINT_URL": _moto_server,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process group (the worker's nanny and its children), then SIGKILL."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(deadline - time.monotonic(), 0.1))
        with contextlib.suppress(ProcessLookupError):  # the group may outlive its leader
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def _cluster(
    elsewhere: Path, env: dict[str, str], nworkers: int
) -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    """A `dask scheduler` (the first process) and ``nworkers`` single-threaded workers
    started in ``elsewhere``: its address and the processes, stopped on leaving."""
    from distributed import Client

    info = elsewhere / "scheduler.json"
    procs: list[subprocess.Popen[bytes]] = []
    logs = contextlib.ExitStack()

    def start(*args: str) -> None:
        log = logs.enter_context(open(elsewhere / f"{args[0]}.log", "ab"))  # noqa: SIM115
        procs.append(
            subprocess.Popen(
                [DASK, *args],
                cwd=elsewhere,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killed whole at the end
            )
        )

    try:
        start(
            "scheduler",
            *("--host", "127.0.0.1", "--port", "0", "--no-dashboard"),
            *("--scheduler-file", str(info)),
            *("--idle-timeout", "300"),  # gone even if pytest is killed before `finally`
        )
        deadline = time.monotonic() + 30
        while not (info.exists() and info.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert info.exists(), (elsewhere / "scheduler.log").read_text()
        address = json.loads(info.read_text())["address"]
        start(
            "worker",
            address,
            *("--nworkers", str(nworkers), "--nthreads", "1"),
            *("--host", "127.0.0.1", "--no-dashboard"),
            *("--death-timeout", "30"),  # and the workers 30 s after their scheduler
        )
        with Client(address, timeout="30s") as client:
            client.wait_for_workers(nworkers, timeout=60)
        yield address, procs
    finally:
        _stop(procs)
        logs.close()


def _worker_env(s3_env: dict[str, str]) -> dict[str, str]:
    """The workers' environment: the installed tfshards, its pure-Python loops."""
    env = {k: v for k, v in s3_env.items() if k != "PYTHONPATH"}
    env["TFSHARDS_PURE_PYTHON"] = "1"
    return env


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory: pytest.TempPathFactory, s3_env: dict[str, str]) -> Iterator[str]:
    """Address of a `dask scheduler` with two single-threaded worker processes."""
    with _cluster(tmp_path_factory.mktemp("cluster"), _worker_env(s3_env), 2) as (address, _):
        yield address


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project folder with 48 raw images under raw/ and their listing at data/listing."""
    write_synthetic(str(tmp_path / "raw"), 48, 16, workers=1)
    _cli(tmp_path, "list", "raw", "--out", "data/listing")  # a relative root
    return tmp_path


def _cli(
    cwd: Path, *args: str, env: dict[str, str] | None = None, ok: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    if ok:
        assert result.returncode == 0, result.stderr
    return result


def _shards(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.rglob("*.tfrecord"))}


WRITE = ("write", "data/listing", "--num-shards", "4")


def test_relative_listing_written_and_validated_by_python_loop_workers_matches_a_local_run(
    project, scheduler
):
    _cli(project, *WRITE, "--executor", "serial", "--no-progress")
    local_shards = _shards(project / "data/shards")
    local_manifest = (project / "data/manifest.json").read_bytes()
    shutil.rmtree(project / "data/shards")
    (project / "data/manifest.json").unlink()

    dask = ("--executor", "dask", "--dask-address", scheduler, "--shared-fs")
    wrote = _cli(project, *WRITE, *dask)
    assert _shards(project / "data/shards") == local_shards
    assert (project / "data/manifest.json").read_bytes() == local_manifest
    said = (
        f"dask, {scheduler}: 2 workers, 2 threads, 1 host; "
        "compiled loops (tfshards.format._native) on 0/2"
    )
    assert said in wrote.stderr

    checked = _cli(project, "validate", "data/manifest.json", "--metrics", "m.json", *dask)
    assert said in checked.stderr
    assert json.loads((project / "m.json").read_text())["problems"] == 0


def test_local_paths_with_a_scheduler_are_refused_without_shared_fs(project, scheduler):
    dask = ("--executor", "dask", "--dask-address", scheduler)
    refused = _cli(project, *WRITE, *dask, ok=False)
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("error: ")
    assert f"{project / 'raw'}: a local path with the Dask scheduler {scheduler}" in refused.stderr
    assert "--shared-fs" in refused.stderr
    assert not (project / "data/shards").exists()

    _cli(project, *WRITE, "--executor", "serial", "--no-progress")
    refused = _cli(project, "validate", "data/manifest.json", *dask, ok=False)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert "a local path with the Dask scheduler" in refused.stderr


def test_a_transform_module_the_workers_cannot_import_is_refused_by_name(project, scheduler):
    (project / "mytransform.py").write_text(
        "def features(path, data, label):\n    return {'size': len(data)}\n"
    )
    dask = ("--executor", "dask", "--dask-address", scheduler, "--shared-fs")
    refused = _cli(project, *WRITE, "--transform", "mytransform:features", *dask, ok=False)
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("error: Dask worker ")
    assert "cannot import module 'mytransform'" in refused.stderr
    assert not list((project / "data").glob("shards/*/*.tfrecord"))


def test_raw_files_and_shards_on_s3_through_a_scheduler_match_a_local_run(
    project, scheduler, s3_env, endpoint
):
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="testing", secret="testing")
    fs.mkdir("bucket")
    try:
        fs.put(str(project / "raw") + "/", "bucket/raw/", recursive=True)
        _cli(project, *WRITE, "--executor", "serial", "--no-progress")
        local_shards = _shards(project / "data/shards")

        _cli(project, "list", "s3://bucket/raw", "--out", "s3listing", env=s3_env)
        dask = ("--dask-address", scheduler)  # implies --executor dask
        _cli(
            project,
            "write",
            "s3listing",
            "--num-shards",
            "4",
            "--out",
            "s3://bucket/shards",
            "--manifest",
            "s3manifest.json",
            *dask,
            env=s3_env,
        )
        manifest = Manifest.from_json((project / "s3manifest.json").read_bytes())
        assert manifest.root.startswith("s3://bucket/shards/")
        on_s3 = {s.name: fs.cat_file(manifest.shard_url(s)) for s in manifest.shards}
        assert on_s3 == local_shards

        _cli(
            project,
            "validate",
            f"{manifest.root}/manifest.json",
            "--metrics",
            "m.json",
            *dask,
            env=s3_env,
        )
        assert json.loads((project / "m.json").read_text())["records"] == 48
    finally:
        fs.rm("bucket", recursive=True)


def test_a_local_cluster_imports_a_transform_from_the_working_directory(project):
    (project / "mytransform.py").write_text(
        "def features(path, data, label):\n    return {'size': len(data)}\n"
    )
    args = (*WRITE, "--transform", "mytransform:features", "--workers", "2")
    _cli(project, *args, "--executor", "serial", "--no-progress")
    local_shards = _shards(project / "data/shards")
    shutil.rmtree(project / "data/shards")  # data/manifest.json stays: say not to grow from it
    ran = _cli(project, *args, "--executor", "dask", "--previous", "none")
    compiled = 2 if native.NATIVE is not None else 0
    assert "dask, local cluster tcp://127.0.0.1:" in ran.stderr
    assert f"compiled loops (tfshards.format._native) on {compiled}/2" in ran.stderr
    assert _shards(project / "data/shards") == local_shards


def _slow_write(project: Path, elsewhere: Path, address: str, **env: str) -> subprocess.Popen[str]:
    """A write on the cluster at ``address`` whose every record takes 0.5 s (48 files), once
    a worker is writing a shard: the transform module, imported by the client from
    ``project`` and by the worker from ``elsewhere``, touches a file first."""
    started = project / "started"
    transform = (
        "import pathlib, time\n"
        "def features(path, data, label):\n"
        f"    pathlib.Path({str(started)!r}).touch()\n"
        "    time.sleep(0.5)\n"
        "    return {'size': len(data)}\n"
    )
    for folder in (project, elsewhere):
        (folder / "slowtransform.py").write_text(transform)
    dask = ("--dask-address", address, "--shared-fs", "--no-progress")
    write = subprocess.Popen(
        [*CLI, *WRITE, "--transform", "slowtransform:features", *dask],
        cwd=project,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not started.exists() and write.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), write.communicate()  # a worker is writing a shard
    return write


def test_a_scheduler_killed_mid_write_is_one_line_naming_the_unfinished_shards(
    project, tmp_path_factory, s3_env
):
    elsewhere = tmp_path_factory.mktemp("doomed")
    with _cluster(elsewhere, _worker_env(s3_env), 1) as (address, procs):
        write = _slow_write(project, elsewhere, address)
        os.killpg(procs[0].pid, signal.SIGKILL)  # the scheduler, 48 files x 0.5 s from done
        killed = time.monotonic()
        _, stderr = write.communicate(timeout=60)
    assert write.returncode == 1
    assert stderr.count("\n") == 1, stderr
    assert stderr.startswith(f"error: dask, {address}: lost the scheduler (it stopped or cannot")
    assert "while working on data-00000-of-00004.tfrecord" in stderr
    assert stderr.rstrip().endswith("finished shards are kept: run again to resume")
    assert time.monotonic() - killed < 10  # not the client's 10 s of reconnecting first


@pytest.mark.slow
def test_a_port_that_accepts_but_is_no_scheduler_is_one_line_not_a_hang(project):
    """Client(timeout=...) bounds the connection, not the handshake: this hung for good."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    address = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    _cli(project, *WRITE, "--executor", "serial", "--no-progress")
    started = time.monotonic()
    try:
        said = _cli(
            project, "validate", "data/manifest.json", "--dask-address", address, "--shared-fs",
            ok=False,
        )  # fmt: skip
    finally:
        listener.close()
        for conn in accepted:
            conn.close()
    assert said.returncode == 1 and said.stderr.count("\n") == 1, said.stderr
    assert said.stderr.startswith(f"error: cannot reach the Dask scheduler {address}: it accepted")
    assert time.monotonic() - started < cluster.CONNECT_S + 5 + 15  # the CLI's start besides


def _killer(folder: Path, target: str) -> None:
    """A transform module that kills its own process on ``target`` (a segfaulting decoder,
    the OOM killer), for the client and the workers to import from their folders."""
    (folder / "killer.py").write_text(
        "import os, signal\n"
        "def features(path, data, label):\n"
        f"    if path.endswith({target!r}):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return {'size': len(data)}\n"
    )


@pytest.mark.slow
def test_a_shard_whose_workers_die_running_it_is_one_line_naming_it(
    project, tmp_path_factory, s3_env
):
    elsewhere = tmp_path_factory.mktemp("killed")
    target = sorted(p.name for p in (project / "raw").rglob("*.*"))[7]
    for folder in (project, elsewhere):
        _killer(folder, target)
    env = {**_worker_env(s3_env), "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "1"}
    with _cluster(elsewhere, env, 1) as (address, _):
        dask = ("--dask-address", address, "--shared-fs", "--no-progress")
        said = _cli(project, *WRITE, "--transform", "killer:features", *dask, ok=False)
    assert said.returncode == 1 and said.stderr.count("\n") == 1, said.stderr
    assert said.stderr.startswith(f"error: dask, {address}: the workers running data-0000")
    assert ".tfrecord died (2 tries): killed by a signal or out of memory" in said.stderr
    assert not (project / "data" / "manifest.json").exists()


@pytest.mark.slow
def test_a_cluster_left_without_workers_stops_in_one_line(project, tmp_path_factory, s3_env):
    elsewhere = tmp_path_factory.mktemp("orphaned")
    with _cluster(elsewhere, _worker_env(s3_env), 1) as (address, procs):
        write = _slow_write(project, elsewhere, address, **{cluster.NO_WORKERS_ENV: "3"})
        os.killpg(procs[1].pid, signal.SIGKILL)  # the worker's nanny and the worker
        _, stderr = write.communicate(timeout=60)
    assert write.returncode == 1 and stderr.count("\n") == 1, stderr
    assert stderr.startswith(f"error: dask, {address}: no workers for 3 s (all stopped or were")
    assert stderr.rstrip().endswith("start workers and run again to resume")
