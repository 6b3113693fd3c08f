"""Writing shard sets: plan, encode, frame and publish shards, then the manifest last."""

# The modules other wings may import; the rest are this wing's own.
__all__ = ["config", "sharding", "writer"]
