"""The TFRecord and tf.train.Example formats: a Python reference and its C fast path."""

# The modules other wings may import; the rest are this wing's own.
__all__ = [
    "columns",
    "example",
    "exampleparser",
    "exif",
    "imageformat",
    "imageheader",
    "native",
    "phash",
    "recordbuffer",
    "records",
    "schema",
    "tfrecord",
    "wire",
]
