"""The compiled train and eval steps of a classifier, on one device or mirrored over several."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tfshards.errors import ConfigError


class TrainSteps:
    """Cross-entropy steps for ``model`` under ``strategy``, and their running metrics.

    Each global batch is cut into one equal slice per replica; every replica
    computes the summed loss of its slice over the global batch size, and the
    optimizer all-reduces (sums) the gradients, so N replicas take the same
    step one device would on the whole batch. With ``per_replica_input`` the
    batches come already cut (a distributed dataset's ``PerReplica`` values, as
    under ``multi_worker``), each replica's ``global_batch / replicas`` records.

    Args:
        model: probabilities out (from :func:`tfshards.training.models.build_model`),
            built under ``strategy.scope()``.
        optimizer: a Keras optimizer made under ``strategy.scope()``.
        strategy: a ``tf.distribute`` strategy (the default one for one device).
        classes: number of classes.
        global_batch: records per training step, divisible by the replicas.
        label_smoothing: share of the target spread over all classes, in [0, 1).
        class_weights: per-class loss weight, or None for 1 each.
        mixed: the model runs in float16: scale the loss so small gradients
            do not flush to zero.
        jit_compile: compile the steps with XLA.
        per_replica_input: the train step takes per-replica batches.
    """

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        *,
        strategy: Any,
        classes: int,
        global_batch: int,
        label_smoothing: float = 0.0,
        class_weights: Sequence[float] | None = None,
        mixed: bool = False,
        jit_compile: bool = False,
        per_replica_input: bool = False,
    ) -> None:
        import keras
        import tensorflow as tf

        replicas = strategy.num_replicas_in_sync
        if global_batch % replicas:
            raise ConfigError(
                f"batch_size {global_batch} must be a multiple of the {replicas} replicas "
                "(it is the global batch, cut into equal slices)"
            )
        with strategy.scope():
            if mixed:
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            if label_smoothing:
                loss: Any = keras.losses.CategoricalCrossentropy(
                    label_smoothing=label_smoothing, reduction=None
                )
            else:
                loss = keras.losses.SparseCategoricalCrossentropy(reduction=None)
            # Compiled too, so the saved .keras file evaluates and trains on as it is.
            model.compile(optimizer=optimizer, loss=loss, metrics=["accuracy"])
            optimizer.build(model.trainable_variables)  # its variables made outside tf.function
        weights = None if class_weights is None else tf.constant(class_weights, tf.float32)
        self.model, self.optimizer, self.strategy = model, optimizer, strategy
        self.per_replica_input = per_replica_input
        # Made outside the strategy: updated once per step with the reduced values.
        self.loss, self.val_loss = keras.metrics.Mean(), keras.metrics.Mean()
        self.accuracy, self.val_accuracy = keras.metrics.Mean(), keras.metrics.Mean()

        def per_example(y: Any, probs: Any) -> Any:
            target = tf.one_hot(y, classes) if label_smoothing else y
            return loss(target, probs)

        def replica_step(x: Any, y: Any) -> tuple[Any, Any]:
            with tf.GradientTape() as tape:
                probs = model(x, training=True)
                losses = per_example(y, probs)
                if weights is not None:
                    losses = losses * tf.gather(weights, y)
                total = tf.reduce_sum(losses) / global_batch
                scaled = optimizer.scale_loss(total) if mixed else total
            grads = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return total, _correct(tf, y, probs)

        def train_step(x: Any, y: Any) -> Any:
            if replicas > 1 and not per_replica_input:
                x, y = _slices(tf, strategy, x, replicas), _slices(tf, strategy, y, replicas)
            total, correct = strategy.run(replica_step, args=(x, y))
            total = strategy.reduce(tf.distribute.ReduceOp.SUM, total, axis=None)
            correct = strategy.reduce(tf.distribute.ReduceOp.SUM, correct, axis=None)
            self.loss.update_state(total)
            self.accuracy.update_state(correct / global_batch)
            return total

        def eval_step(x: Any, y: Any) -> Any:
            probs = model(x, training=False)
            n = tf.shape(y)[0]
            self.val_loss.update_state(tf.reduce_mean(per_example(y, probs)), sample_weight=n)
            self.val_accuracy.update_state(_correct(tf, y, probs) / tf.cast(n, tf.float32), n)
            return tf.argmax(probs, axis=-1)

        # No tensor control flow to convert (as in Keras 3's fit()); reduce_retracing: a last,
        # smaller eval batch costs one relaxed retrace at most.
        traced = {"jit_compile": jit_compile, "reduce_retracing": True, "autograph": False}
        self.train, self._eval = tf.function(train_step, **traced), tf.function(eval_step, **traced)

    def records(self, labels: Any) -> int:
        """Records of a training step, all workers': ``labels`` is this worker's part."""
        if not self.per_replica_input:
            return int(labels.shape[0])
        local = self.strategy.experimental_local_results(labels)
        workers = self.strategy.num_replicas_in_sync // max(1, len(local))
        return int(sum(int(t.shape[0]) for t in local) * workers)

    def train_metrics(self) -> tuple[float, float]:
        """Mean loss and accuracy since the last call (one epoch); then resets them."""
        values = float(self.loss.result()), float(self.accuracy.result())
        self.loss.reset_state()
        self.accuracy.reset_state()
        return values

    def evaluate(self, dataset: Any) -> tuple[float, float, list[int], list[int]]:
        """Loss, accuracy, labels and predicted classes over every record of ``dataset``."""
        self.val_loss.reset_state()
        self.val_accuracy.reset_state()
        labels: list[int] = []
        predicted: list[int] = []
        for x, y in dataset:
            predicted.extend(int(p) for p in self._eval(x, y).numpy())
            labels.extend(int(v) for v in y.numpy())
        return float(self.val_loss.result()), float(self.val_accuracy.result()), labels, predicted


def _correct(tf: Any, y: Any, probs: Any) -> Any:
    hits = tf.equal(tf.argmax(probs, axis=-1, output_type=y.dtype), y)
    return tf.reduce_sum(tf.cast(hits, tf.float32))


def _slices(tf: Any, strategy: Any, tensor: Any, replicas: int) -> Any:
    """One equal slice of the batch per replica (a ``PerReplica`` value)."""
    parts = tf.split(tensor, replicas)
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: parts[ctx.replica_id_in_sync_group]
    )
