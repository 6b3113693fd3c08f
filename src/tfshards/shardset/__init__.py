"""A shard set's contract: what every stage agrees a version directory is.

The manifest and its fields, the directory layout and the writer's lease on
it, each shard's member list, grouping of related files, how images were
resized, the interop files TensorFlow Datasets reads, the split buckets and the
train/validation split by whole bucket, the comparison of two versions, and
leakage across sets mixed for training.
Writing produces this; reading, validation and training consume it.
"""

# The modules other wings may import; the rest are this wing's own.
__all__ = ["buckets", "check", "crossleaks", "datasetinfo", "diff", "grouping", "histogram",
           "imagestats", "layout", "lease", "manifest", "members", "resize",
           "split"]  # fmt: skip
