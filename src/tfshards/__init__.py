"""tfshards: reproducible, parallel TFRecord shards from raw files, for DVC pipelines.

The public API is re-exported here and imported on first use, so
``import tfshards`` loads neither TensorFlow nor fsspec until a name that needs
them is touched.
"""

from __future__ import annotations

import importlib
from typing import Any

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
    "write": "tfshards.writer",
    "Manifest": "tfshards.manifest",
    "load_manifest": "tfshards.manifest",
    # validate
    "ValidateConfig": "tfshards.validate",
    "validate_shards": "tfshards.validate",
    # read (TensorFlow)
    "Split": "tfshards.loader",
    "SplitWarning": "tfshards.loader",
    "find_corrupt_record": "tfshards.loader",
    "make_dataset": "tfshards.loader",
    "shard_errors": "tfshards.loader",
    "split": "tfshards.loader",
    "ShardCache": "tfshards.cache",
    "FileSplit": "tfshards.generator",
    "from_files": "tfshards.generator",
    "split_files": "tfshards.generator",
    # sample data
    "write_digits": "tfshards.sample",
    "write_synthetic": "tfshards.sample",
}
# Exported under another name where the plain one is a submodule's: after
# `import tfshards.validate`, `tfshards.validate` is the module, not the function.
_RENAMED = {"load_manifest": "load", "validate_shards": "validate"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tfshards' has no attribute {name!r}")
    return getattr(importlib.import_module(module), _RENAMED.get(name, name))


__all__ = [
    "ConfigError",
    "InputError",
    "RecordError",
    "ShardError",
    "TfshardsError",
    "TransformError",
    "ValidationError",
    "__version__",
    *sorted(_LAZY),
]
