"""The dvclive log of a run: per-epoch metrics, and the validation confusion matrix and plots.

dvclive is imported when a log is opened, not with this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tfshards import atomicfile, storage
from tfshards.training import confusion
from tfshards.training.history import EpochResult


def start(directory: str | None, *, resumed: int) -> Any:
    """The dvclive log in ``directory`` (None: no log), going on after ``resumed`` epochs.

    Without epochs to go on from, a ``confusion.csv`` left in the folder (it
    persists for resuming) is removed: a stale matrix is never kept.
    """
    if directory is not None and resumed:
        _forget_steps(directory, resumed)
    live = _open(directory, resume=bool(resumed))
    if live is not None and resumed:
        live.step = resumed  # epochs logged after the checkpoint are logged again
    elif directory is not None:
        fs, path = storage.open_url(_confusion_url(directory))
        if fs.exists(path):
            fs.rm(path)
    return live


def log_epoch(live: Any, result: EpochResult) -> None:
    """One epoch's metrics at the next step (nothing without a log)."""
    if live is None:
        return
    for name, value in result.metrics().items():
        live.log_metric(name, value)
    live.next_step()


def log_confusion(
    directory: str | None,
    live: Any,
    matrix: list[list[int]],
    labels: Sequence[str],
    predictions: tuple[list[int], list[int]],
) -> None:
    """The validation confusion matrix: ``confusion.csv`` and dvclive's plot of it."""
    if directory is None or live is None:
        return
    fs, path = storage.open_url(_confusion_url(directory))
    atomicfile.write_atomic(fs, path, [confusion.to_csv(matrix, labels)])
    actual, predicted = predictions
    live.log_sklearn_plot(
        "confusion_matrix",
        [labels[i] for i in actual],
        [labels[i] for i in predicted],
        name="confusion_matrix.json",
    )
    accuracy = confusion.class_accuracy(matrix, labels)
    live.log_plot(
        "val_class_accuracy",
        [{"label": k, "accuracy": v} for k, v in accuracy.items()],
        x="accuracy",
        y="label",
        template="bar_horizontal",
    )


def _open(directory: str | None, *, resume: bool = False) -> Any:
    if directory is None:
        return None
    from dvclive.live import Live
    from scmrepo.exceptions import SCMError

    class _Live(Live):
        def _init_dvc(self) -> None:
            # In a git repository with no commit yet (a new project's first
            # `dvc repro`), dvclive 3.49 asks git for HEAD before its own
            # no-commit check and raises "Empty git repo". With the options
            # below it needs nothing from the repository there (no experiment
            # can be saved without a commit), so log as it does outside git.
            try:
                super()._init_dvc()
            except SCMError:
                self._dvc_repo = None

        def post_data_to_studio(self) -> None:
            # dvclive 3.49 starts a thread on each Live's first step to post to DVC
            # Studio, whether one is set up or not, and it never ends: a process that
            # trained ten times held ten of them (and each Live). Without Studio,
            # nothing is posted: no thread.
            if "data" in getattr(self, "_studio_events_to_skip", ()):
                return
            super().post_data_to_studio()  # type: ignore[no-untyped-call]

    # DVC runs this as a stage: dvclive must not edit dvc.yaml, make experiments or reports.
    # resume: the step count goes on from the last logged epoch instead of starting over.
    return _Live(dir=directory, save_dvc_exp=False, dvcyaml=False, report=None, resume=resume)


def _forget_steps(directory: str, resumed: int) -> None:
    """Drop the rows of step ``resumed`` and later from each metric's series: epochs a
    killed run logged after its last checkpoint are logged again by the resumed run (a
    kill between an epoch's log and its checkpoint left step 1 twice in every series)."""
    fs, root = storage.open_url(storage.join(directory, "plots", "metrics"))
    if not fs.isdir(root):
        return
    for path in sorted(fs.find(root)):
        if not path.endswith(".tsv"):
            continue
        lines = storage.read_bytes(fs, path).decode("utf-8").splitlines(keepends=True)
        header = lines[0].split("\t") if lines else []
        if "step" not in header:
            continue
        at = header.index("step")
        kept = [lines[0], *(row for row in lines[1:] if _step(row, at) < resumed)]
        if len(kept) < len(lines):
            atomicfile.write_atomic(fs, path, ["".join(kept).encode("utf-8")])


def _step(row: str, at: int) -> int:
    """The step of a series row (a row without one is kept: step -1)."""
    cells = row.rstrip("\n").split("\t")
    return int(cells[at]) if at < len(cells) and cells[at].isdigit() else -1


def _confusion_url(live_dir: str) -> str:
    return f"{live_dir.rstrip('/')}/confusion.csv"
