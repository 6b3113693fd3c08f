"""The options of a stage that fans out over shards (write, validate): its ``RunOptions``."""

from __future__ import annotations

import dataclasses
from typing import Any

from tfshards.option import Option
from tfshards.processes import cpu_count
from tfshards.run.executor import RunOptions


def run_options(executor_help: str) -> tuple[Option, ...]:
    """The options of a stage that fans out over shards: its ``RunOptions``, and progress."""
    return (
        Option(
            "workers",
            int,
            cpu_count(),
            "Shards worked on at once (default: all cores).",
            field="run.workers",
        ),
        Option("executor", str, "auto", executor_help, field="run.executor"),
        Option(
            "dask_address",
            str | None,
            None,
            "Dask scheduler to run on, e.g. tcp://scheduler:8786 (implies --executor dask; "
            "--executor dask without it starts a local cluster).",
            field="run.address",
        ),
        Option(
            "shared_fs",
            bool,
            False,
            "With --dask-address: local paths are on a filesystem every worker mounts at "
            "the same path (without it they are refused: each worker would use its own disk).",
            field="run.shared_fs",
        ),
        Option("progress", bool, True, "Show progress.", field=None),
    )


def with_run_keywords(
    run: RunOptions,
    workers: int | None,
    executor: str | None,
    dask_address: str | None,
    shared_fs: bool | None,
) -> RunOptions:
    """``run`` with the flat keywords a config also takes (``WriteConfig(workers=8)``) applied."""
    given: dict[str, Any] = {
        key: value
        for key, value in (
            ("workers", workers),
            ("executor", executor),
            ("address", dask_address),
            ("shared_fs", shared_fs),
        )
        if value is not None
    }
    return dataclasses.replace(run, **given) if given else run
