"""tfshards: reproducible, parallel TFRecord shards from raw files, for DVC pipelines."""

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

__all__ = [
    "ConfigError",
    "InputError",
    "RecordError",
    "ShardError",
    "TfshardsError",
    "TransformError",
    "ValidationError",
    "__version__",
]
