"""The TFRecord and tf.train.Example formats (a Python reference and its C fast path), and
the images they carry."""

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
    "pixels",
    "recordbuffer",
    "records",
    "schema",
    "tfrecord",
    "wire",
]
