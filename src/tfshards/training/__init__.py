"""The train stage: a Keras classifier fed from shards, timed, checkpointed, exported."""

# The modules other wings may import; the rest are this wing's own.
__all__ = ["devices", "models", "optim", "train", "trainconfig"]
