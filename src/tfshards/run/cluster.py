"""The Dask executor: run tasks on a cluster, once its workers are shown able to run them.

Before a task is shipped: the data locations are checked (a local path means
each worker's own disk unless the user says it is shared), then one
``client.run`` round trip asks every worker for its tfshards version, whether
it has the compiled loops, whether it imports the transform with the same
source, and whether it sees the local inputs. Any mismatch stops the run with
one line naming the worker.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tfshards._version import __version__
from tfshards.errors import ConfigError, ShardError, TransformError
from tfshards.format import native
from tfshards.run import transform as transforms
from tfshards.run.executor import Executor, Needs, is_remote
from tfshards.storage import split_protocol

T = TypeVar("T")
R = TypeVar("R")

LOCAL_PROTOCOLS = (None, "file", "local")
CONNECT_S = 10  # a scheduler that does not answer within this (+5 s for the handshake)
POLL_S = 5  # how often a run waiting on its tasks asks whether the cluster has workers
# A run whose cluster has had no worker this long stops (an autoscaled cluster that takes
# longer to bring workers back: set the variable higher).
NO_WORKERS_ENV = "TFSHARDS_DASK_NO_WORKERS_S"
NO_WORKERS_S = 60.0


def is_local_path(url: str) -> bool:
    """True for a path on this machine's disk (no protocol, or ``file://``)."""
    return split_protocol(url)[0] in LOCAL_PROTOCOLS


def check_locations(address: str | None, needs: Needs) -> None:
    """Refuse a local data location with a scheduler, unless ``needs.shared_fs``."""
    if not is_remote(address) or needs.shared_fs:
        return
    for url in needs.locations:
        if is_local_path(url):
            raise ConfigError(
                f"{url}: a local path with the Dask scheduler {address} means each worker's "
                "own disk; use a URL every worker reaches (s3://...), or pass --shared-fs "
                "if it is on a filesystem all workers mount at the same path"
            )


@dataclass(frozen=True)
class WorkerReport:
    """What one worker said about itself."""

    address: str
    host: str
    threads: int
    version: str
    native: bool
    transform_error: str  # empty: imported, same source
    missing: tuple[str, ...]  # local inputs it cannot see


def probe(transform: str | None, identity: str, inputs: Sequence[str]) -> dict[str, Any]:
    """Run on each worker: its version, compiled loops, transform and local inputs."""
    error = ""
    if transform is not None:
        try:
            found = transforms.identity(transform)
        except TransformError as exc:
            error = str(exc)
        else:
            if found != identity:
                error = (
                    f"transform {transform!r}: module source differs from the client's "
                    f"(worker {found.rsplit('@', 1)[-1]}, client {identity.rsplit('@', 1)[-1]})"
                )
    return {
        "host": socket.gethostname(),
        "version": __version__,
        "native": native.NATIVE is not None,
        "transform_error": error,
        "missing": [p for p in inputs if is_local_path(p) and not os.path.exists(p)],
    }


def check_workers(client: Any, needs: Needs) -> list[WorkerReport]:
    """Ask every worker what it has (one round trip); raise on the first that cannot run."""
    threads = client.nthreads()
    if not threads:
        raise ConfigError("the Dask scheduler has no workers yet; start some with `dask worker`")
    asked = [*needs.inputs, *(needs.samples() if needs.samples is not None else ())]
    inputs = [p for p in asked if is_local_path(p)]
    answers = client.run(
        probe, needs.transform, needs.transform_identity, inputs, on_error="return"
    )
    reports = []
    for address in sorted(answers):
        a = answers[address]
        if isinstance(a, BaseException):  # e.g. no tfshards there to unpickle `probe` with
            raise ConfigError(
                f"Dask worker {address}: cannot run tfshards "
                f"({type(a).__name__}: {' '.join(str(a).split())}); "
                f"install tfshards {__version__} on the workers"
            )
        report = WorkerReport(
            address=address,
            host=a["host"],
            threads=int(threads.get(address, 1)),
            version=a["version"],
            native=a["native"],
            transform_error=a["transform_error"],
            missing=tuple(a["missing"]),
        )
        if report.version != __version__:
            raise ConfigError(
                f"Dask worker {address}: tfshards {report.version}, expected "
                f"{__version__} (the client's); install the same version on the workers"
            )
        if report.transform_error:
            raise TransformError(
                f"Dask worker {address}: {report.transform_error}; install the transform's "
                "module on the workers (or put it on their PYTHONPATH)",
                transform=needs.transform,
            )
        if report.missing:
            raise ConfigError(
                f"Dask worker {address} on {report.host}: {report.missing[0]} does not exist "
                "there; --shared-fs needs the same path mounted on every worker"
            )
        reports.append(report)
    return reports


def describe(address: str, reports: Sequence[WorkerReport]) -> str:
    """One line saying what ran: workers, threads, hosts, compiled loops or not."""
    threads = sum(r.threads for r in reports)
    hosts = len({r.host for r in reports})
    compiled = sum(r.native for r in reports)
    line = (
        f"dask, {address}: {len(reports)} workers, {threads} threads, {hosts} "
        f"host{'s' * (hosts != 1)}; compiled loops (tfshards.format._native) "
        f"on {compiled}/{len(reports)}"
    )
    slow = sum(not r.native and r.threads > 1 for r in reports)
    if slow:
        line += (
            f"; {slow} worker{'s' * (slow != 1)} without them "
            f"run{'s' * (slow == 1)} several threads, which "
            "take turns on the GIL in the Python loops: start such workers with "
            "--nthreads 1 and more --nworkers"
        )
    return line


def run(
    fn: Callable[[T], R],
    tasks: Sequence[T],
    workers: int,
    address: str | None,
    needs: Needs,
    note: Callable[[str], object] | None = None,
    name: Callable[[T], str] = str,
) -> Iterator[tuple[int, R]]:
    """Yield ``(task index, result)`` as tasks finish on the cluster at ``address``.

    ``address`` None (or ``"local"``) starts a cluster of ``workers`` processes
    on 127.0.0.1 for this run. ``note`` receives the line saying what ran;
    ``name`` names a task in errors.

    Raises:
        ShardError: the scheduler went away mid-run (its client cancels every
            task); names the tasks that had not finished.
    """
    check_locations(address, needs)
    _no_workers_s()  # a bad value of its variable stops the run before it starts
    try:
        from distributed import Client, KilledWorker, LocalCluster
    except ImportError as exc:
        raise ConfigError(
            "executor 'dask' needs dask[distributed]: pip install 'tfshards[dask]'"
        ) from exc
    client, cluster, shown = _client(Client, LocalCluster, address, workers)
    lost = False
    try:
        reports = check_workers(client, needs)
        if note is not None:
            note(describe(shown, reports))
        # pure=False: with the default, Dask runs identical calls only once.
        futures = client.map(fn, list(tasks), pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        unfinished = set(index.values())

        def left() -> list[str]:
            return [name(tasks[i]) for i in sorted(unfinished)]

        try:
            with _client_logs_held():
                for future in _finished(client, futures, shown, left, needs.after):
                    if future.status == "cancelled":
                        lost = True
                        raise lost_scheduler(shown, _raised(future), left(), needs.after)
                    try:
                        result = future.result()
                    except KilledWorker as exc:  # its workers died running it, every try
                        shard = name(tasks[index[future.key]])
                        raise killed_workers(shown, exc, shard, needs.after) from None
                    unfinished.discard(index[future.key])
                    yield index[future.key], result
        finally:
            if client.status == "running":  # else its IO loop is gone: nothing to cancel on
                client.cancel(futures)
    finally:
        with quiet_logging(lost):
            client.close()
            if cluster is not None:
                cluster.close()


def _client(
    client_class: Any, cluster_class: Any, address: str | None, workers: int
) -> tuple[Any, Any, str]:
    """A client of the scheduler at ``address``, or of a local cluster of ``workers``
    processes started for this run; the cluster (None for a remote one); its name."""
    if not is_remote(address):
        # Loopback only: LocalCluster serves on 0.0.0.0:8787 unless told otherwise.
        # Its worker processes start in this directory, so a transform module found
        # here imports there too (tfshards.run.transform.load puts the cwd on sys.path).
        cluster = cluster_class(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        )
        return client_class(cluster), cluster, f"local cluster {cluster.scheduler_address}"
    from distributed.comm.addressing import get_address_host_port

    try:  # before Client(): one that fails on a bad address can hang the next one
        get_address_host_port(str(address))
    except ValueError as exc:
        raise ConfigError(
            f"dask_address: expected a scheduler address like tcp://host:8786, "
            f"got {address!r} ({exc})"
        ) from exc
    return _connect(client_class, str(address)), None, str(address)


def _connect(client_class: Any, address: str) -> Any:
    """A client of the scheduler at ``address``, or one line saying why there is none.

    ``Client(timeout=...)`` bounds the connection, not the handshake after it: a
    port that accepts and never answers as a Dask scheduler would (another server,
    a proxy) held it for good. So the client is made in a thread given
    :data:`CONNECT_S` and a little more.
    """
    box: dict[str, Any] = {}

    def connect() -> None:
        try:
            box["client"] = client_class(address, timeout=f"{CONNECT_S}s")
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=connect, name="tfshards-dask-connect", daemon=True)
    thread.start()
    thread.join(CONNECT_S + 5)
    if thread.is_alive():
        raise ConfigError(
            f"cannot reach the Dask scheduler {address}: it accepted the connection but gave "
            f"no answer within {CONNECT_S + 5} s (is this a Dask scheduler's port?)"
        )
    error = box.get("error")
    if isinstance(error, OSError):  # refused, or no answer within the timeout
        raise ConfigError(f"cannot reach the Dask scheduler {address}: {error}") from error
    if error is not None:
        raise error
    return box["client"]


def _finished(
    client: Any,
    futures: Sequence[Any],
    shown: str,
    left: Callable[[], list[str]],
    after: str = Needs.after,
) -> Iterator[Any]:
    """Each future as it finishes.

    Dask keeps tasks waiting while a cluster has no workers, for workers that may
    join. A thread asks the scheduler every :data:`POLL_S` how many there are; after
    :func:`_no_workers_s` with none it cancels the tasks, and the run stops in one
    line instead of waiting for good.
    """
    from distributed import as_completed

    limit = _no_workers_s()
    stop, alone = threading.Event(), threading.Event()

    def watch() -> None:
        since: float | None = None
        while not stop.wait(POLL_S) and client.status == "running":
            if _workers(client):
                since = None
                continue
            since = time.monotonic() if since is None else since
            if time.monotonic() - since >= limit:
                alone.set()
                client.cancel(futures)  # wakes the loop below
                return

    threading.Thread(target=watch, name="tfshards-dask-workers", daemon=True).start()
    try:
        for future in as_completed(futures):
            if alone.is_set():
                raise no_workers(shown, left(), after)
            yield future
    finally:
        stop.set()


def _raised(future: Any) -> BaseException:
    """What asking a cancelled future for its result raises (it says why it was cancelled)."""
    try:
        future.result()
    except BaseException as exc:
        return exc
    return concurrent.futures.CancelledError()  # not reached: it was cancelled


def _no_workers_s() -> float:
    """How long a run waits with no worker: :data:`NO_WORKERS_ENV`, else :data:`NO_WORKERS_S`."""
    text = os.environ.get(NO_WORKERS_ENV, "")
    try:
        value = float(text) if text else NO_WORKERS_S
    except ValueError:
        raise ConfigError(f"{NO_WORKERS_ENV}: expected seconds, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise ConfigError(f"{NO_WORKERS_ENV}: expected seconds >= 0, got {text!r}")
    return value


def _workers(client: Any) -> int:
    """How many workers the scheduler has now; a lost scheduler is for the caller to see."""
    try:
        return len(client.nthreads())
    except Exception:  # the scheduler went away: its futures are cancelled next
        return 1


def no_workers(shown: str, names: Sequence[str], after: str = Needs.after) -> ShardError:
    """The one-line error for a run whose cluster lost every worker and got none back."""
    return ShardError(
        f"dask, {shown}: no workers for {_no_workers_s():g} s (all stopped or were killed) while "
        f"working on {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}; "
        f"{after.replace('run again', 'start workers and run again')}",
        shards=list(names),
    )


def killed_workers(
    shown: str, exc: BaseException, shard: str, after: str = Needs.after
) -> ShardError:
    """The one-line error for a task whose workers all died running it."""
    failures = getattr(exc, "allowed_failures", None)
    tries = failures + 1 if isinstance(failures, int) else 0
    times = f" ({tries} {'try' if tries == 1 else 'tries'})" if tries else ""
    return ShardError(
        f"dask, {shown}: the workers running {shard} died{times}: killed by a signal or out "
        f"of memory (a crash in a decoder or a transform, or too little memory for it); {after}",
        shard=shard,
    )


def lost_scheduler(
    shown: str, cancelled: BaseException, names: Sequence[str], after: str = Needs.after
) -> ShardError:
    """The one-line error for tasks the client saw cancelled: their scheduler went away."""
    reason = getattr(cancelled, "reason", None) or type(cancelled).__name__
    what = (
        "lost the scheduler (it stopped or cannot be reached)"
        if reason == "scheduler-connection-lost"
        else f"the cluster cancelled the tasks ({reason})"
    )
    return ShardError(
        f"dask, {shown}: {what} while working on "
        f"{', '.join(names[:4])}{' ...' if len(names) > 4 else ''}; {after}",
        shards=list(names),
    )


@contextlib.contextmanager
def _client_logs_held() -> Iterator[None]:
    """No log lines from the client while tasks are waited for: a worker that died before
    its result was gathered logs "Couldn't gather ... rescheduling" (the client reschedules
    the task), a lost scheduler each failed reconnection with its traceback; the run ends
    with one line that says what happened, which they would bury."""
    client_log = logging.getLogger("distributed.client")
    level = client_log.level
    client_log.setLevel(max(level, logging.CRITICAL))
    try:
        yield
    finally:
        client_log.setLevel(level)


@contextlib.contextmanager
def quiet_logging(quiet: bool) -> Iterator[None]:
    """With ``quiet``, no log records while the block runs: a client closed after losing
    its scheduler logs the reconnection it abandons as ERROR tracebacks (CancelledError),
    which would bury the one line that says what happened."""
    if not quiet:
        yield
        return
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(previous)


class DaskExecutor(Executor):
    """Tasks on the Dask scheduler at ``options.address``, or on a local cluster of
    ``options.workers`` processes started for each :meth:`map` when there is none."""

    name = "dask"
    remote = True

    def map(
        self,
        fn: Callable[[T], R],
        tasks: Sequence[T],
        *,
        describe: Callable[[T], str] = str,
        needs: Needs | None = None,
        note: Callable[[str], object] | None = None,
    ) -> Iterator[tuple[int, R]]:
        if not tasks:
            return
        needs = needs or Needs()
        if self.options.shared_fs:  # the user's word for this run, whatever the caller's needs
            needs = dataclasses.replace(needs, shared_fs=True)
        yield from run(fn, tasks, self.options.workers, self.options.address, needs, note, describe)
