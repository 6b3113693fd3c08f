"""The train stage: a Keras classifier fed from shards, timed, checkpointed, exported."""
