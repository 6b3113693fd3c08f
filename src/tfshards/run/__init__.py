"""Running tasks: the executor seam and its serial, thread, process and Dask implementations."""
