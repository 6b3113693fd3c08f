"""Validating shard sets against their manifest: per shard, per record, across the set."""
