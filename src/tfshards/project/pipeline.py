"""The tfshards DVC stages (list -> write -> validate -> train) and their params sections.

The one definition of the pipeline: ``tfshards init`` writes it into a user's
repository, and this repository's own ``dvc.yaml`` is the same stages run
through ``python stages/*.py`` with the library's source files as extra
``deps`` (a test keeps the two in agreement). Pure data, no I/O.

Two variants, chosen by where the shards go:

- local (``data/shards``): the shard folder is a persisted, cached out, so a
  re-run after a crash resumes from finished shards and a tampered shard
  re-runs ``validate``.
- remote (``s3://``, ``gs://``, any fsspec URL): DVC tracks only the manifest
  and the metrics. DVC 3 refuses cached outs on ``s3://``; a ``cache: false``
  remote out makes DVC delete the whole prefix before each run unless it is
  persisted, and a persisted one leaves ``dvc.lock`` stale. The version
  directory is named by the write's inputs, so the manifest names the shards.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tfshards.errors import ConfigError
from tfshards.listing import listoptions
from tfshards.listing.treefilter import DEFAULT_EXTENSIONS
from tfshards.project import stageoptions
from tfshards.training import trainconfig
from tfshards.training.trainconfig import TrainConfig
from tfshards.validation import config as validateconfig
from tfshards.writing import config as writeconfig

STAGES = ("list", "write", "validate", "train")
LISTING = "data/listing"
LIST_METRICS = "results/list/metrics.json"
MANIFEST = "data/manifest.json"
VALIDATE_METRICS = "results/validate/metrics.json"
BALANCE = "results/validate/balance"  # train.json, val.json: records per label of each side
# A bar per label, one plot per side of the split (`dvc plots show`).
BALANCE_PLOT = {"cache": False, "template": "bar_horizontal", "x": "count", "y": "label"}
IMAGE_METRICS = "results/validate/images.json"  # per side: images, non-RGB share, formats, medians
IMAGE_PLOTS = "results/validate/images"  # train.json, val.json: each side's width histogram
IMAGE_PLOT = {"cache": False, "template": "linear", "x": "width_px", "y": "images"}
TRAIN_METRICS = "results/train/metrics.json"
LIVE_DIR = "results/train/live"
MODEL = "models/model.keras"
SPLIT = "results/train/split.json"
EXPORT = "models/export"
CHECKPOINTS = "checkpoints/train"  # not an out: DVC deletes outs before a stage runs
PLOTS = {
    f"{LIVE_DIR}/plots/metrics": {"x": "step"},
    f"{LIVE_DIR}/plots/sklearn/confusion_matrix.json": {
        "template": "confusion",
        "x": "actual",
        "y": "predicted",
    },
    f"{LIVE_DIR}/plots/custom/val_class_accuracy.json": {
        "template": "bar_horizontal",
        "x": "accuracy",
        "y": "label",
    },
}

# TrainConfig fields that are output paths fixed by the pipeline, not params.
TRAIN_PATHS = {
    "manifest": MANIFEST,
    "metrics": TRAIN_METRICS,
    "live_dir": LIVE_DIR,
    "model_out": MODEL,
    "split_out": SPLIT,
    "export_out": EXPORT,
    "checkpoint_dir": CHECKPOINTS,
}

# PipelineSpec field -> the param that holds it (init reads them back on a re-run).
SPEC_PARAMS = {
    "root": ("list", "root"),
    "extensions": ("list", "extensions"),
    "shards": ("write", "out"),
    "name": ("write", "name"),
    "image_size": ("train", "image_size"),
}

# Comments written beside each param (params.yaml is the file users edit).
PARAM_COMMENTS = {
    "list": stageoptions.comments(listoptions.OPTIONS),
    "write": stageoptions.comments(writeconfig.OPTIONS),
    "validate": stageoptions.comments(validateconfig.OPTIONS),
    "train": stageoptions.comments(trainconfig.OPTIONS),
}
# Params an earlier release's init wrote that no command reads now: `init --force` removes them.
RETIRED_PARAMS = {"write": ("near_duplicates",)}  # now validate.near_duplicates


@dataclass(frozen=True)
class PipelineSpec:
    """What ``tfshards init`` asks: where the data is and the first params.

    Attributes:
        root: raw files in ImageFolder layout (``ROOT/<label>/...``), a path or URL.
        shards: where version directories go; a URL other than ``file://``
            gives the remote variant.
        name: shard file prefix.
        image_size: height = width images are resized to for training, in pixels.
        extensions: comma-separated suffixes the listing keeps.
    """

    root: str = "data/raw"
    shards: str = "data/shards"
    name: str = "data"
    image_size: int = 64
    extensions: str = ",".join(DEFAULT_EXTENSIONS)

    def __post_init__(self) -> None:
        for field in ("root", "shards", "name", "extensions"):
            if not str(getattr(self, field)).strip():
                raise ConfigError(f"{field} must not be empty", option=field)
        if any(c in self.name for c in "/ ${}"):
            raise ConfigError(f"name must be a plain file prefix, got {self.name!r}", option="name")
        TrainConfig(image_size=self.image_size)  # the default model accepts this size

    @property
    def remote(self) -> bool:
        """True when the shards go to a non-local fsspec URL (the remote variant)."""
        return is_remote(self.shards)


def is_remote(url: str) -> bool:
    """True for a URL whose protocol is not local disk (``s3://``, ``gs://``, ``memory://``)."""
    import fsspec.utils  # on first use: `tfshards --help` does not pay for fsspec

    return fsspec.utils.get_protocol(url) not in ("file", "local")


def params(spec: PipelineSpec) -> dict[str, dict[str, Any]]:
    """The params.yaml sections the stages read, with ``spec``'s values and defaults."""
    return {
        "list": stageoptions.params(
            listoptions.OPTIONS, {"root": spec.root, "extensions": spec.extensions}
        ),
        # Local shards are one DVC out: it holds this version only, or clones differ.
        "write": stageoptions.params(
            writeconfig.OPTIONS,
            {
                "out": spec.shards,
                "name": spec.name,
                "old_versions": "keep" if spec.remote else "remove",
            },
        ),
        "validate": stageoptions.params(validateconfig.OPTIONS),
        "train": stageoptions.params(trainconfig.OPTIONS, {"image_size": spec.image_size}),
    }


def stages(*, remote: bool, program: Callable[[str], str]) -> dict[str, dict[str, Any]]:
    """The four stages as DVC declares them, in pipeline order.

    Args:
        remote: the remote variant (only the manifest and metrics are outs).
        program: the command prefix that runs a stage, given its name, e.g.
            ``lambda s: f"tfshards {s}"``.
    """
    shard_deps = [] if remote else ["${write.out}"]
    return {
        "list": _list_stage(program),
        "write": _write_stage(program, remote),
        "validate": _validate_stage(program, shard_deps),
        "train": _train_stage(program, shard_deps),
    }


def _list_stage(program: Callable[[str], str]) -> dict[str, Any]:
    return {
        "cmd": stageoptions.dvc_command(
            program("list"), "list", listoptions.OPTIONS, {"out": LISTING, "metrics": LIST_METRICS}
        ),
        "deps": ["${list.root}"],
        "params": ["list"],
        "outs": [LISTING],
        "metrics": [{LIST_METRICS: {"cache": False}}],
    }


def _write_stage(program: Callable[[str], str], remote: bool) -> dict[str, Any]:
    shard_outs: list[Any] = [] if remote else [{"${write.out}": {"persist": True}}]
    return {
        # DVC unpacks the section into `--key value` words, each string through
        # shlex.quote: a group_by regex reaches the command as written, whatever
        # quotes or `$(...)` it holds (`'${write.group_by}'` let a quote end it).
        # The command reads `--num_shards` as `--num-shards` (cli.write.CONTEXT).
        "cmd": stageoptions.dvc_command(
            program("write"),
            "write",
            writeconfig.OPTIONS,
            {"listing": LISTING, "manifest": MANIFEST},
            unpack=True,
        ),
        "deps": [LISTING],
        "params": ["write"],
        # Persisted: DVC would delete it before the run, and it names the version
        # the next one grows from (write --previous auto).
        "outs": [{MANIFEST: {"persist": True}}, *shard_outs],
    }


def _validate_stage(program: Callable[[str], str], shard_deps: list[str]) -> dict[str, Any]:
    paths = {
        "manifest": MANIFEST,
        "metrics": VALIDATE_METRICS,
        "balance": BALANCE,
        "image_metrics": IMAGE_METRICS,
        "image_plots": IMAGE_PLOTS,
    }
    return {
        # The split params are train's: the same shards are held out here and there.
        "cmd": stageoptions.dvc_command(
            program("validate"), "validate", validateconfig.OPTIONS, paths
        ),
        "deps": [MANIFEST, *shard_deps],
        "params": ["validate", "train.val_fraction", "train.seed", "train.split_seed"],
        "metrics": [{VALIDATE_METRICS: {"cache": False}}, {IMAGE_METRICS: {"cache": False}}],
        "plots": [
            {f"{BALANCE}/train.json": dict(BALANCE_PLOT)},
            {f"{BALANCE}/val.json": dict(BALANCE_PLOT)},
            {f"{IMAGE_PLOTS}/train.json": dict(IMAGE_PLOT)},
            {f"{IMAGE_PLOTS}/val.json": dict(IMAGE_PLOT)},
        ],
    }


def _train_stage(program: Callable[[str], str], shard_deps: list[str]) -> dict[str, Any]:
    return {
        # A mapping param (model_args) goes after `--`: DVC unpacks it into `--key value`.
        "cmd": stageoptions.dvc_command(
            program("train"), "train", trainconfig.OPTIONS, TRAIN_PATHS
        ),
        "deps": [MANIFEST, *shard_deps, VALIDATE_METRICS],
        "params": ["train"],
        "outs": [
            MODEL,
            EXPORT,
            {SPLIT: {"cache": False}},
            # dvclive's folder as a whole: under `dvc exp run` dvclive would
            # git-add any file in it that is not a DVC out. Persisted so a
            # resumed run continues its step count.
            {LIVE_DIR: {"cache": False, "persist": True}},
        ],
        "metrics": [{TRAIN_METRICS: {"cache": False}}],
    }
