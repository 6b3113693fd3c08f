"""A DVC project's side: the pipeline definition, scaffolding, sample data, pruning."""

# The modules other wings may import; the rest are this wing's own.
__all__ = ["ignores", "pipeline", "prune", "rawdata", "sample", "scaffold", "stageoptions"]
