"""The TFRecord and tf.train.Example formats: a Python reference and its C fast path."""
