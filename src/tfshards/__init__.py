"""tfshards: reproducible, parallel TFRecord shards from raw files, for DVC pipelines.

The public API is re-exported here and imported on first use, so
``import tfshards`` loads neither TensorFlow nor fsspec until a name that needs
them is touched.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tfshards.errors import (
    ConfigError,
    InputError,
    RecordError,
    ShardError,
    TfshardsError,
    TransformError,
    ValidationError,
)

__version__ = "0.1.0"

_LAZY = {
    # list
    "Listing": "tfshards.listing",
    "list_files": "tfshards.listing",
    "read_listing": "tfshards.listing",
    "write_listing": "tfshards.listing",
    # write
    "WriteConfig": "tfshards.writer",
    "WriteResult": "tfshards.writer",
    "write": "tfshards.writer",
    "Manifest": "tfshards.manifest",
    "ShardInfo": "tfshards.manifest",
    "load_manifest": "tfshards.manifest",
    # validate
    "ValidateConfig": "tfshards.validate",
    "ValidationReport": "tfshards.validate",
    "validate_shards": "tfshards.validate",
    # prune
    "PruneConfig": "tfshards.prune",
    "prune_versions": "tfshards.prune",
    # read (TensorFlow)
    "Split": "tfshards.splits",
    "SplitWarning": "tfshards.splits",
    "split": "tfshards.splits",
    "find_corrupt_record": "tfshards.corruption",
    "shard_errors": "tfshards.corruption",
    "make_dataset": "tfshards.loader",
    "ShardCache": "tfshards.cache",
    "FileSplit": "tfshards.splits",
    "split_files": "tfshards.splits",
    "from_files": "tfshards.generator",
    # sample data
    "write_digits": "tfshards.sample",
    "write_synthetic": "tfshards.sample",
}
# Exported under another name where the plain one is a submodule's: after
# `import tfshards.validate`, `tfshards.validate` is the module, not the function.
_RENAMED = {"load_manifest": "load", "validate_shards": "validate", "prune_versions": "prune"}

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ imports on first use
    from tfshards.cache import ShardCache
    from tfshards.corruption import find_corrupt_record, shard_errors
    from tfshards.generator import from_files
    from tfshards.listing import Listing, list_files, read_listing, write_listing
    from tfshards.loader import make_dataset
    from tfshards.manifest import Manifest, ShardInfo
    from tfshards.manifest import load as load_manifest
    from tfshards.prune import PruneConfig
    from tfshards.prune import prune as prune_versions
    from tfshards.sample import write_digits, write_synthetic
    from tfshards.splits import FileSplit, Split, SplitWarning, split, split_files
    from tfshards.validate import ValidateConfig, ValidationReport
    from tfshards.validate import validate as validate_shards
    from tfshards.writer import WriteConfig, WriteResult, write


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
    "validate_shards",
    "write",
    "write_digits",
    "write_listing",
    "write_synthetic",
]
