"""The image classifiers ``tfshards train`` builds, chosen by name, and their compiled steps.

Names and size limits are checked without TensorFlow (a bad option fails in
milliseconds); Keras is imported only when a model is built. Every model takes
float32 images in [0, 1] of shape ``(size, size, channels)`` and outputs class
probabilities in float32, also under a mixed-precision policy (a float16
softmax loses too much for the loss; the TensorFlow mixed-precision guide
keeps the last activation in float32).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tfshards.errors import ConfigError


@dataclass(frozen=True)
class ModelSpec:
    """What a model name stands for.

    Attributes:
        name: the name given on the command line.
        min_image_size: smallest height (= width) in pixels the model accepts.
        description: one line for ``--help`` and errors.
    """

    name: str
    min_image_size: int
    description: str


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        # Two blocks of two 3x3 convs, each block halving the size: 8 px
        # (the digits' own size) still leaves a 2x2 map.
        ModelSpec("small_cnn", 8, "4 conv layers + dense head, ~0.6M params at 32 px"),
        # Keras refuses MobileNetV3 inputs under 32x32 (its stem and five
        # stride-2 stages would shrink anything smaller to nothing).
        ModelSpec("mobilenet_v3_small", 32, "keras.applications.MobileNetV3Small, from scratch"),
    )
}


def model_spec(name: str, image_size: int) -> ModelSpec:
    """The spec of model ``name``, checked against ``image_size``.

    Raises:
        ConfigError: unknown name (the message lists the valid ones) or an
            image size below the model's minimum.
    """
    spec = MODELS.get(name)
    if spec is None:
        raise ConfigError(
            f"unknown model {name!r}; valid names: {', '.join(sorted(MODELS))}",
            model=name,
            valid=sorted(MODELS),
        )
    if image_size < spec.min_image_size:
        raise ConfigError(
            f"model {name!r} needs images of at least {spec.min_image_size}x"
            f"{spec.min_image_size} pixels, got image_size={image_size}",
            model=name,
            image_size=image_size,
            min_image_size=spec.min_image_size,
        )
    return spec


def build_model(name: str, *, image_size: int, channels: int, classes: int) -> Any:
    """Build model ``name`` (a ``keras.Model``) under the current dtype policy.

    Args:
        name: a key of :data:`MODELS`.
        image_size: input height and width in pixels.
        channels: input channels (1 for grayscale, 3 for RGB).
        classes: number of output classes, >= 2.
    """
    model_spec(name, image_size)
    if channels < 1:
        raise ConfigError(f"channels must be >= 1, got {channels}")
    if classes < 2:
        raise ConfigError(f"a classifier needs at least 2 classes, got {classes}", classes=classes)
    return _BUILDERS[name](image_size, channels, classes)


def _small_cnn(size: int, channels: int, classes: int) -> Any:
    import keras
    from keras import layers

    inputs = keras.Input((size, size, channels), name="image")
    x = inputs
    for filters in (32, 64):
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        # Average, not max: XLA has no deterministic MaxPool gradient, and this model
        # must run with --deterministic true --jit-compile true.
        x = layers.AveragePooling2D(2)(x)
    x = layers.Flatten()(x)
    x = layers.Dropout(0.3)(x)
    x = layers.Dense(128, activation="relu")(x)
    x = layers.Dropout(0.3)(x)
    x = layers.Dense(classes, name="logits")(x)
    outputs = layers.Activation("softmax", dtype="float32", name="probabilities")(x)
    return keras.Model(inputs, outputs, name="small_cnn")


def _mobilenet_v3_small(size: int, channels: int, classes: int) -> Any:
    import keras
    from keras import layers

    inputs = keras.Input((size, size, channels), name="image")
    # Without its own preprocessing layer MobileNetV3 expects [-1, 1].
    x = layers.Rescaling(2.0, offset=-1.0)(inputs)
    backbone = keras.applications.MobileNetV3Small(
        input_shape=(size, size, channels),
        weights=None,
        classes=classes,
        include_preprocessing=False,
        classifier_activation=None,
    )
    x = backbone(x)
    outputs = layers.Activation("softmax", dtype="float32", name="probabilities")(x)
    return keras.Model(inputs, outputs, name="mobilenet_v3_small")


class TrainSteps:
    """Adam on cross-entropy for ``model``: compiled train and eval steps and their metrics.

    Args:
        model: a model from :func:`build_model` (probabilities out).
        learning_rate: Adam's step size.
        mixed: the model was built under ``mixed_float16``: scale the loss so
            small float16 gradients do not flush to zero.
        jit_compile: compile both steps with XLA.
    """

    def __init__(self, model: Any, learning_rate: float, *, mixed: bool, jit_compile: bool) -> None:
        import keras
        import tensorflow as tf

        optimizer: Any = keras.optimizers.Adam(learning_rate)
        if mixed:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        # Compiled too, so the saved .keras file evaluates and resumes as it is.
        model.compile(
            optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"]
        )
        optimizer.build(model.trainable_variables)  # its variables made outside tf.function
        loss_fn = keras.losses.SparseCategoricalCrossentropy()
        self.model = model
        self.loss, self.val_loss = keras.metrics.Mean(), keras.metrics.Mean()
        self.accuracy = keras.metrics.SparseCategoricalAccuracy()
        self.val_accuracy = keras.metrics.SparseCategoricalAccuracy()

        def train_step(x: Any, y: Any) -> Any:
            with tf.GradientTape() as tape:
                probs = model(x, training=True)
                loss = loss_fn(y, probs)
                scaled = optimizer.scale_loss(loss) if mixed else loss
            grads = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            self.loss.update_state(loss)
            self.accuracy.update_state(y, probs)
            return loss

        def eval_step(x: Any, y: Any) -> Any:
            probs = model(x, training=False)
            self.val_loss.update_state(loss_fn(y, probs), sample_weight=tf.shape(y)[0])
            self.val_accuracy.update_state(y, probs)

        # reduce_retracing: a last, smaller eval batch costs one relaxed retrace at most.
        self.train = tf.function(train_step, jit_compile=jit_compile, reduce_retracing=True)
        self._eval = tf.function(eval_step, jit_compile=jit_compile, reduce_retracing=True)

    def train_metrics(self) -> tuple[float, float]:
        """Mean loss and accuracy since the last call (one epoch); then resets them."""
        values = float(self.loss.result()), float(self.accuracy.result())
        self.loss.reset_state()
        self.accuracy.reset_state()
        return values

    def evaluate(self, dataset: Any) -> tuple[float, float]:
        """Loss and accuracy over every record of ``dataset`` (a finite one)."""
        self.val_loss.reset_state()
        self.val_accuracy.reset_state()
        for x, y in dataset:
            self._eval(x, y)
        return float(self.val_loss.result()), float(self.val_accuracy.result())


_BUILDERS: dict[str, Callable[[int, int, int], Any]] = {
    "small_cnn": _small_cnn,
    "mobilenet_v3_small": _mobilenet_v3_small,
}
