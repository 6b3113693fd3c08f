"""Writing shard sets: plan, encode, frame and publish shards, then the manifest last."""
