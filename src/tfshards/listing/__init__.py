"""Listing raw files: walk a tree or read an index file, hash contents, store the listing."""
