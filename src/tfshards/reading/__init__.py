"""Reading shards into tf.data: splits by shard file, verified local copies, decoding,
and raw files through a per-file function on thread or process pools."""

# The modules other wings may import; the rest are this wing's own.
__all__ = ["cache", "corruption", "decode", "filesplit", "generator", "loader", "options"]
