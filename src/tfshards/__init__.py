"""tfshards: reproducible, parallel TFRecord shards from raw files, for DVC pipelines.

The public API is re-exported here and imported on first use, so
``import tfshards`` loads neither TensorFlow nor fsspec until a name that needs
them is touched.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tfshards._version import __version__
from tfshards.errors import (
    ConfigError,
    InputError,
    RecordError,
    ShardError,
    TfshardsError,
    TransformError,
    ValidationError,
)

_LAZY = {
    # list
    "Listing": "tfshards.listing.listing",
    "list_files": "tfshards.listing.listing",
    "read_listing": "tfshards.listing.listing",
    "write_listing": "tfshards.listing.listing",
    # write
    "WriteConfig": "tfshards.writing.config",
    "WriteResult": "tfshards.writing.writer",
    "write": "tfshards.writing.writer",
    "Manifest": "tfshards.shardset.manifest",
    "ShardInfo": "tfshards.shardset.manifest",
    "load_manifest": "tfshards.shardset.manifest",
    # validate
    "ValidateConfig": "tfshards.validation.config",
    "ValidationReport": "tfshards.validation.validate",
    "validate_shards": "tfshards.validation.validate",
    # prune
    "PruneConfig": "tfshards.project.prune",
    "prune_versions": "tfshards.project.prune",
    # read (TensorFlow)
    "Split": "tfshards.shardset.split",
    "SplitWarning": "tfshards.shardset.split",
    "split": "tfshards.shardset.split",
    "find_corrupt_record": "tfshards.reading.corruption",
    "shard_errors": "tfshards.reading.corruption",
    "make_dataset": "tfshards.reading.loader",
    "steps_per_epoch": "tfshards.reading.loader",
    "ShardCache": "tfshards.reading.cache",
    "FileSplit": "tfshards.reading.filesplit",
    "split_files": "tfshards.reading.filesplit",
    "from_files": "tfshards.reading.generator",
    "file_errors": "tfshards.reading.generator",
    # sample data
    "write_digits": "tfshards.project.sample",
    "write_synthetic": "tfshards.project.sample",
}
# Exported under a longer name where the module's own name is too plain for the
# package namespace (`validate_shards` says more than a bare `validate` would).
_RENAMED = {"load_manifest": "load", "validate_shards": "validate", "prune_versions": "prune"}

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ imports on first use
    from tfshards.listing.listing import Listing, list_files, read_listing, write_listing
    from tfshards.project.prune import PruneConfig
    from tfshards.project.prune import prune as prune_versions
    from tfshards.project.sample import write_digits, write_synthetic
    from tfshards.reading.cache import ShardCache
    from tfshards.reading.corruption import find_corrupt_record, shard_errors
    from tfshards.reading.filesplit import FileSplit, split_files
    from tfshards.reading.generator import file_errors, from_files
    from tfshards.reading.loader import make_dataset, steps_per_epoch
    from tfshards.shardset.manifest import Manifest, ShardInfo
    from tfshards.shardset.manifest import load as load_manifest
    from tfshards.shardset.split import Split, SplitWarning, split
    from tfshards.validation.config import ValidateConfig
    from tfshards.validation.validate import ValidationReport
    from tfshards.validation.validate import validate as validate_shards
    from tfshards.writing.config import WriteConfig
    from tfshards.writing.writer import WriteResult, write


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tfshards' has no attribute {name!r}")
    return getattr(importlib.import_module(module), _RENAMED.get(name, name))


__all__ = [
    "ConfigError",
    "FileSplit",
    "InputError",
    "Listing",
    "Manifest",
    "PruneConfig",
    "RecordError",
    "ShardCache",
    "ShardError",
    "ShardInfo",
    "Split",
    "SplitWarning",
    "TfshardsError",
    "TransformError",
    "ValidateConfig",
    "ValidationError",
    "ValidationReport",
    "WriteConfig",
    "WriteResult",
    "__version__",
    "file_errors",
    "find_corrupt_record",
    "from_files",
    "list_files",
    "load_manifest",
    "make_dataset",
    "prune_versions",
    "read_listing",
    "shard_errors",
    "split",
    "split_files",
    "steps_per_epoch",
    "validate_shards",
    "write",
    "write_digits",
    "write_listing",
    "write_synthetic",
]
