"""Reading shards into tf.data: splits by shard file, verified local copies, decoding."""
