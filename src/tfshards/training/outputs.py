"""Where a run's outputs go, checked before its first epoch against what is there and
against the shard sets it reads.

A run replaces its outputs: dvclive clears its folder (``metrics.json``, ``plots/``,
and a ``params.yaml`` or ``dvc.yaml`` it finds there), an export replaces a folder,
the metrics, model and split files are written over. So each must be a path the
run may take: not a manifest it reads nor inside a version folder it reads (that
set would then fail ``validate``), a file where a file goes and one like a run
writes (JSON with its keys, a Keras archive), and a folder that holds only what
such a run writes. Each refusal is one line naming the option.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from tfshards import jsonfile, storage
from tfshards.errors import ConfigError
from tfshards.shardset import layout
from tfshards.shardset.layout import MANIFEST_NAME
from tfshards.shardset.manifest import Manifest
from tfshards.training.history import SERIES
from tfshards.training.trainconfig import OUTPUTS, TrainConfig

_FILES = ("metrics", "model_out", "split_out")  # outputs that are one file each
# What a run's dvclive folder holds (save_dvc_exp, dvcyaml and report off): the metrics,
# the per-epoch series (those a run logs, by name: any .tsv let a user's own series of
# another run be deleted), the two plots and the confusion matrix. dvclive itself would
# also remove a params.yaml, dvc.yaml or report there, which a run never writes.
_LIVE_FILES = re.compile(  # relative paths, "/" between folders
    r"metrics\.json|confusion\.csv|plots/metrics/(?:" + "|".join(SERIES) + r")\.tsv"
    r"|plots/custom/val_class_accuracy\.json|plots/sklearn/confusion_matrix\.json"
)


def check(config: TrainConfig, manifests: Sequence[Manifest]) -> None:
    """Refuse an output path the run must not take (see the module notes). Paths are
    compared as the system resolves them (links followed, ``file://`` read as a path),
    so a link to a version folder or manifest is that folder or manifest.

    Raises:
        ConfigError: naming the option, the path and what is there.
    """
    reads = [
        (path, "a manifest it reads")
        for given in (config.manifest, *(p for p, _ in config.mix))
        if (path := _resolved(given))
    ]
    for manifest in manifests:
        if folder := _resolved(manifest.directory):
            reads.append((os.path.join(folder, MANIFEST_NAME), "a manifest it reads"))
            reads.append((folder, "the version folder it reads"))
    for name in OUTPUTS:
        value = getattr(config, name)
        path = _resolved(value) if value else ""
        if not path:
            continue
        for taken, what in reads:
            if path == taken or path.startswith(taken.rstrip(os.sep) + os.sep):
                where = "is" if path == taken else f"is inside {taken!r},"
                raise ConfigError(
                    f"{name}: expected a path outside the shard sets the run reads, found "
                    f"{value!r}, which {where} {what}; pass another",
                    option=name,
                )
        # any version's folder, not only those the run reads: a file there fails validate
        where = path if name in _FILES else os.path.join(path, "_")
        layout.refuse_in_version(where, "--" + name.replace("_", "-"))
        if name in _FILES and os.path.isdir(path):
            raise ConfigError(
                f"{name}: expected a file path, found a folder at {value!r}; pass another",
                option=name,
            )
        if name in _FILES and os.path.isfile(path):
            _check_replaceable(name, value, path)
    if config.live_dir and _resolved(config.live_dir):
        check_live_dir(config.live_dir)
    if config.export_out and _resolved(config.export_out):
        check_target(os.path.abspath(config.export_out))


# Keys every such file of a run holds, for telling an earlier run's file from one of the
# user's (tfshards.jsonfile.check_replaceable: an object holding them all is a run's).
_KEYS = {
    "metrics": ("loss", "accuracy", "epochs"),
    "split_out": ("train", "val", "fingerprint", "seed", "val_fraction"),
}


def _check_replaceable(name: str, value: str, path: str) -> None:
    """Refuse a file output that holds a file no run wrote: a JSON file without the keys
    the run writes, or a model that is no Keras archive (a user's files given as
    --metrics, --split-out or --model-out were written over at the end of the run).

    Raises:
        ConfigError: naming the option and what is there.
    """
    if name == "model_out":
        if not _keras_archive(path):
            raise ConfigError(
                f"model_out: expected a new file or a Keras model a run saved, found a file "
                f"that is none at {value!r}: pass another --model-out or remove it",
                option=name,
            )
        return
    fs, local = storage.open_url(path)
    try:
        jsonfile.check_replaceable(fs, local, dict.fromkeys(_KEYS[name]))
    except ConfigError as exc:
        raise ConfigError(f"{name}: {exc}", option=name) from None


def _keras_archive(path: str) -> bool:
    """Whether ``path`` is a ``.keras`` archive: a zip holding Keras' ``metadata.json``."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            return "metadata.json" in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def _resolved(path: str) -> str:
    """A local path or ``file://`` URL as the system resolves it; "" for another store."""
    if path.startswith("file://"):
        path = path[len("file://") :]
    elif "://" in path:
        return ""
    return os.path.realpath(path)


def check_live_dir(directory: str) -> None:
    """Refuse a dvclive folder that is a file, or holds a file no run writes there.

    Raises:
        ConfigError: naming the folder and the first such file.
    """
    if not os.path.lexists(directory):
        return
    if found := _not_a_folder(directory):
        raise ConfigError(
            f"live_dir: expected a folder for dvclive's log (or none), found {found} at "
            f"{directory!r}; pass another --live-dir",
            option="live_dir",
        )
    for folder, dirs, files in os.walk(directory):
        dirs.sort()
        # A link inside is refused whatever it names: dvclive would write through it.
        for name in sorted([*files, *(d for d in dirs if os.path.islink(os.path.join(folder, d)))]):
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, directory).replace(os.sep, "/")
            if os.path.islink(path) or not _LIVE_FILES.fullmatch(rel):
                raise ConfigError(
                    f"live_dir: expected a folder holding only a run's dvclive log (or "
                    f"none), found {rel!r} in {directory!r}, which dvclive would delete or "
                    "a run did not write; pass another --live-dir",
                    option="live_dir",
                )


# What a SavedModel folder Keras writes holds: an earlier export may be replaced, nothing
# else (--export-out . replaced a whole project, a user's folder lost its files). Its files
# are files and its folders folders; ``variables/`` holds the variables' files only and
# ``assets/`` nothing (a tfshards export has no vocabulary files).
_SAVED_MODEL_FILES = frozenset({"saved_model.pb", "fingerprint.pb", "keras_metadata.pb"})
_VARIABLES = re.compile(r"variables\.(?:index|data-\d{5}-of-\d{5})")


def check_target(directory: str) -> None:
    """Refuse an export path that holds anything but an earlier export (an empty folder
    or none is fine).

    Raises:
        ConfigError: naming the path and what is there.
    """
    if not os.path.lexists(directory):
        return
    if found := _not_a_folder(directory):
        raise ConfigError(
            f"{directory}: expected a SavedModel folder an earlier export wrote (or no "
            f"folder), found {found}; pass another --export-out",
            option="export_out",
        )
    other = _not_exported(directory)
    if other:
        raise ConfigError(
            f"{directory}: expected a SavedModel folder an earlier export wrote (or no "
            f"folder), found {len(other)} entries it did not make (first: {other[0]!r}); "
            "pass another --export-out",
            option="export_out",
        )


def _not_exported(directory: str) -> list[str]:
    """The entries of ``directory`` (relative, sorted) an export does not write."""
    out = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name in _SAVED_MODEL_FILES and _regular(path):
            continue
        if name not in ("variables", "assets") or _not_a_folder(path):
            out.append(name)
            continue
        for inner in sorted(os.listdir(path)):
            ours = _VARIABLES.fullmatch(inner) and _regular(os.path.join(path, inner))
            if name != "variables" or not ours:
                out.append(f"{name}/{inner}")
    return out


def _regular(path: str) -> bool:
    """A regular file, not reached through a link."""
    return os.path.isfile(path) and not os.path.islink(path)


def _not_a_folder(path: str) -> str:
    """What stands at ``path`` where a folder of a run's own goes: "a link", "a file", or
    "" for a folder."""
    if os.path.islink(path):
        return "a link"
    return "" if os.path.isdir(path) else "a file"
