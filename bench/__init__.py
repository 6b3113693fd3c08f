"""Benchmarks of tfshards against what a user would otherwise write (``make bench``)."""
