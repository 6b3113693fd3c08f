"""Checks made before tasks go to a Dask cluster: paths, workers' transform and build.

The real scheduler and workers are in ``test_dask_cluster.py``; these run the
same checks in this process, in milliseconds.
"""

from __future__ import annotations

import pytest

from tfshards import storage
from tfshards.errors import ConfigError
from tfshards.format import native
from tfshards.listing.listing import list_files
from tfshards.project.sample import write_synthetic
from tfshards.run import cluster, executor, transform
from tfshards.run.cluster import WorkerReport
from tfshards.run.executor import Needs
from tfshards.writing.config import WriteConfig
from tfshards.writing.plan import plan


def test_relative_local_paths_become_absolute_and_urls_stay(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert storage.absolute("data/shards") == str(tmp_path / "data/shards")
    assert storage.absolute("/srv/raw") == "/srv/raw"
    assert storage.absolute("s3://bucket/raw") == "s3://bucket/raw"
    assert storage.absolute("file:///srv/raw") == "file:///srv/raw"


def test_tasks_carry_absolute_paths_while_the_manifest_keeps_the_given_root(tmp_path, monkeypatch):
    write_synthetic(str(tmp_path / "raw"), 20, 16, workers=1)
    monkeypatch.chdir(tmp_path)
    planned = plan(list_files("raw"), WriteConfig(out="data/shards", num_shards=2))
    version, tasks = planned.version, planned.tasks
    assert version.startswith("data/shards/")
    assert {t.source for t in tasks} == {str(tmp_path / "raw")}
    assert {t.out for t in tasks} == {str(tmp_path / version)}


@pytest.mark.parametrize("url", ["/srv/raw", "file:///srv/raw", "raw"])
def test_a_local_path_with_a_scheduler_is_refused_naming_it_and_the_option(url):
    with pytest.raises(ConfigError) as err:
        cluster.check_locations("tcp://10.0.0.5:8786", Needs(locations=("s3://b/out", url)))
    message = str(err.value)
    assert message.startswith(f"{url}: a local path with the Dask scheduler tcp://10.0.0.5:8786")
    assert "--shared-fs" in message and "\n" not in message


@pytest.mark.parametrize(
    ("address", "needs"),
    [
        ("tcp://10.0.0.5:8786", Needs(locations=("s3://b/raw", "gs://b/out"))),
        ("tcp://10.0.0.5:8786", Needs(locations=("/srv/raw",), shared_fs=True)),
        (None, Needs(locations=("/srv/raw",))),  # a local cluster shares this disk
        ("local", Needs(locations=("/srv/raw",))),
    ],
)
def test_urls_shared_filesystems_and_local_clusters_are_accepted(address, needs):
    cluster.check_locations(address, needs)


def test_a_worker_reports_a_transform_module_it_cannot_import(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    found = cluster.probe("no_such_module_here:fn", "no_such_module_here:fn@0", [])
    assert "cannot import module 'no_such_module_here'" in found["transform_error"]


def test_a_worker_reports_a_transform_whose_source_differs(tmp_path, monkeypatch):
    (tmp_path / "edited_transform.py").write_text("def fn(p, d, l):\n    return {}\n")
    monkeypatch.chdir(tmp_path)
    spec = "edited_transform:fn"
    client_side = transform.identity(spec)
    assert cluster.probe(spec, client_side, [])["transform_error"] == ""
    found = cluster.probe(spec, spec + "@0123456789abcdef", [])
    assert "module source differs from the client's" in found["transform_error"]


def test_a_worker_reports_the_local_inputs_it_cannot_see(tmp_path):
    seen, unseen = str(tmp_path), str(tmp_path / "elsewhere")
    found = cluster.probe(None, "none", [seen, unseen, "s3://bucket/raw"])
    assert found["missing"] == [unseen]
    assert found["native"] is (native.NATIVE is not None)


def _report(compiled: bool, threads: int, host: str = "a") -> WorkerReport:
    return WorkerReport(f"tcp://{host}:1", host, threads, "0.1.0", compiled, "", ())


def test_the_run_line_counts_workers_threads_hosts_and_compiled_loops():
    line = cluster.describe("tcp://s:8786", [_report(True, 1, "a"), _report(False, 1, "b")])
    assert line == (
        "dask, tcp://s:8786: 2 workers, 2 threads, 2 hosts; "
        "compiled loops (tfshards.format._native) on 1/2"
    )


def test_the_run_line_warns_when_python_loops_share_a_gil():
    line = cluster.describe("tcp://s:8786", [_report(False, 4)])
    assert "--nthreads 1" in line


class _Client:
    """Answers ``nthreads`` and ``run`` as a scheduler with these workers would."""

    def __init__(self, answers: dict[str, object]) -> None:
        self.answers = answers

    def nthreads(self) -> dict[str, int]:
        return dict.fromkeys(self.answers, 1)

    def run(self, fn: object, *args: object, on_error: str) -> dict[str, object]:
        return self.answers


def _answer(**changes: object) -> dict[str, object]:
    import tfshards

    found = cluster.probe(None, "none", [])
    assert found["version"] == tfshards.__version__
    return {**found, **changes}


def test_a_worker_with_another_tfshards_version_is_named():
    client = _Client({"tcp://w1:1": _answer(), "tcp://w2:1": _answer(version="0.0.9")})
    with pytest.raises(ConfigError, match=r"^Dask worker tcp://w2:1: tfshards 0\.0\.9, expected "):
        cluster.check_workers(client, Needs())


def test_a_worker_that_cannot_run_the_probe_is_named_on_one_line():
    failure = ModuleNotFoundError("No module named 'tfshards'\n(while unpickling)")
    with pytest.raises(ConfigError) as err:
        cluster.check_workers(_Client({"tcp://w1:1": failure}), Needs())
    assert str(err.value).startswith("Dask worker tcp://w1:1: cannot run tfshards")
    assert "\n" not in str(err.value)


def test_a_scheduler_address_means_the_dask_executor():
    assert executor.resolve("auto", 4, ["file"], dask_address="tcp://s:8786") == "dask"
    assert executor.resolve("dask", 4, ["s3"], dask_address="tcp://s:8786") == "dask"
    assert executor.resolve("auto", 4, ["file"], dask_address="local") == "process"


def test_a_scheduler_address_with_a_local_executor_is_refused():
    with pytest.raises(ConfigError, match=r"needs executor 'dask' \(or 'auto'\), got 'thread'"):
        executor.resolve("thread", 4, ["file"], dask_address="tcp://s:8786")


@pytest.mark.parametrize("address", ["scheduler:port", "xyz://127.0.0.1:8786"])
def test_a_malformed_scheduler_address_is_refused_on_one_line(address):
    with pytest.raises(ConfigError) as err:
        list(cluster.run(str, ["task"], 1, address, Needs()))
    assert str(err.value).startswith("dask_address: expected a scheduler address like tcp://")
    assert repr(address) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_a_bad_wait_for_workers_stops_the_run_before_it_starts(monkeypatch, value):
    monkeypatch.setenv(cluster.NO_WORKERS_ENV, value)
    with pytest.raises(ConfigError, match=f"{cluster.NO_WORKERS_ENV}: expected seconds"):
        next(cluster.run(str, ["a"], 1, "tcp://127.0.0.1:1", Needs()))


class _ProbingClient(_Client):
    """Runs the probe here, for each worker, with the arguments a scheduler would send."""

    def run(self, fn: object, *args: object, on_error: str) -> dict[str, object]:
        return {address: fn(*args) for address in self.answers}  # type: ignore[operator]


def test_a_worker_that_misses_a_listed_file_under_a_root_it_sees_is_named(tmp_path):
    """An unmounted share is an empty mount point: the root is there, its files are not.
    Every file then failed as missing, and under on_error skip a version of the rest
    was published."""
    root = tmp_path / "raw"
    (root / "a").mkdir(parents=True)
    (root / "a" / "1.png").write_bytes(b"x")
    asked: list[int] = []

    def samples() -> list[str]:
        asked.append(1)
        return [str(root / "a" / "1.png"), str(root / "b" / "2.png")]

    needs = Needs(locations=(str(root),), inputs=(str(root),), shared_fs=True, samples=samples)
    with pytest.raises(ConfigError) as err:
        cluster.check_workers(_ProbingClient({"tcp://w1:1": None}), needs)
    assert str(err.value).startswith(
        f"Dask worker tcp://w1:1 on {__import__('socket').gethostname()}: "
        f"{root / 'b' / '2.png'} does not exist there; --shared-fs needs the same path"
    )
    assert asked == [1]  # found once, when a cluster is asked


def test_a_lost_runs_line_ends_with_what_its_caller_keeps():
    """Validate keeps no shards: its lost-cluster lines told the user to resume them."""
    after = "validate writes nothing until its end: run again"
    lost = cluster.no_workers("tcp://s:1", ["a.tfrecord"], after)
    said = "; validate writes nothing until its end: start workers and run again"
    assert str(lost).endswith(said)
    cancelled = cluster.lost_scheduler("tcp://s:1", RuntimeError(), ["a.tfrecord"], after)
    assert str(cancelled).endswith(f"; {after}")
    assert str(cluster.no_workers("tcp://s:1", ["a.tfrecord"])).endswith(
        "finished shards are kept: start workers and run again to resume"
    )
