"""A DVC project's side: the pipeline definition, scaffolding, sample data, pruning, the lock."""

# The modules other wings may import; the rest are this wing's own.
__all__ = [
    "dvclock",
    "ignores",
    "pipeline",
    "prune",
    "rawdata",
    "sample",
    "scaffold",
    "stageoptions",
]
