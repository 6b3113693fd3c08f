"""Reading shards: into tf.data (splits, verified local copies, decoding), one record or a
contact sheet without TensorFlow,
and raw files through a per-file function on thread or process pools."""

# The modules other wings may import; the rest are this wing's own.
__all__ = [
    "boundedfetch",
    "cache",
    "cachespace",
    "corruption",
    "decode",
    "epochorder",
    "filesplit",
    "generator",
    "loader",
    "lookup",
    "mixing",
    "options",
    "pins",
    "sheet",
]
