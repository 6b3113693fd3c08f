"""Listing raw files: walk a tree or read an index file, hash contents, store the listing."""

# The modules other wings may import; the rest are this wing's own.
__all__ = [
    "contenthash",
    "entry",
    "hashcache",
    "listing",
    "listoptions",
    "meta",
    "protocol",
    "storedlisting",
    "treefilter",
    "treelisting",
    "walker",
]
