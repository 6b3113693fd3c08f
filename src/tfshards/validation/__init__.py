"""Validating shard sets against their manifest: per shard, per record, across the set."""

# The modules other wings may import; the rest are this wing's own.
__all__ = ["config", "shardcheck", "validate"]
