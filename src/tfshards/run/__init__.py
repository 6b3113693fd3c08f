"""Running tasks: the executor seam, its serial, thread, process and Dask executors, and
the user's transform they load (``package.module:function``)."""

# The modules other wings may import; the rest are this wing's own.
__all__ = ["cluster", "executor", "localexec", "mpcontext", "options", "transform"]
