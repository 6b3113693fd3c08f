"""The image classifiers ``tfshards train`` builds: built-in names or ``package.module:function``.

Names and size limits are checked without TensorFlow (a bad option fails in
milliseconds); Keras is imported only when a model is built. Every model takes
float32 images in [0, 1] of shape ``(size, size, channels)`` and outputs class
probabilities in float32, also under a mixed-precision policy (a float16
softmax loses too much for the loss; the TensorFlow mixed-precision guide
keeps the last activation in float32).
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
import traceback
from collections.abc import Callable, Mapping
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


AUGMENTATIONS = ("flip", "crop")
_USER_MODEL = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def is_user_model(name: str) -> bool:
    """True for ``package.module:function`` (a user's model), False for a built-in name."""
    return ":" in name


def model_spec(name: str, image_size: int) -> ModelSpec:
    """The spec of model ``name``, checked against ``image_size``.

    A ``package.module:function`` name is checked for its form only here (its
    module is imported by :func:`load_builder`, when training starts).

    Raises:
        ConfigError: unknown name (the message lists the valid ones) or an
            image size below the model's minimum.
    """
    if is_user_model(name):
        if not _USER_MODEL.match(name):
            raise ConfigError(
                f"model {name!r} is not package.module:function (e.g. mypkg.models:build)",
                model=name,
            )
        return ModelSpec(name, 1, "user model")
    spec = MODELS.get(name)
    if spec is None:
        raise ConfigError(
            f"unknown model {name!r}; valid names: {', '.join(sorted(MODELS))}, "
            "or package.module:function",
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


def load_builder(name: str) -> Callable[..., Any]:
    """The function a ``package.module:function`` name stands for, imported now.

    The working directory is searched first (as ``python -m`` does), so a
    module in the repository root is found when DVC runs the stage there.

    Raises:
        ConfigError: the module cannot be imported (not found, does not
            compile, or its code raises), or has no such callable.
    """
    model_spec(name, 1)
    module_name, _, attr = name.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"model {name!r}: cannot import {module_name!r}: {exc}", model=name
        ) from exc
    except SyntaxError as exc:  # IndentationError too: the file is named, not a frame
        where = f"{os.path.basename(exc.filename or '?')}, line {exc.lineno}"
        raise ConfigError(
            f"model {name!r}: cannot import {module_name!r}: {type(exc).__name__}: "
            f"{exc.msg} ({where})",
            model=name,
        ) from None
    except Exception as exc:  # the module's own code can raise anything; we report it, not hide it
        raise ConfigError(
            f"model {name!r}: cannot import {module_name!r}: {described(exc)}", model=name
        ) from None
    builder = getattr(module, attr, None)
    if not callable(builder):
        raise ConfigError(
            f"model {name!r}: module {module_name!r} has no function {attr!r}", model=name
        )
    return builder  # type: ignore[no-any-return]


MESSAGE_CHARS = 300  # Keras errors run to dozens of lines (the call's arguments); the head says it


# Where installed code lives: a frame there is Keras' or Python's, not the user's module.
_INSTALLED = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
_TFSHARDS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def described(exc: BaseException) -> str:
    """``Type: message (file.py:line)`` on one line: the message's head, and the innermost
    frame of the user's own code (else of any code but tfshards' and importlib's)."""
    message = " ".join(str(exc).split())
    if len(message) > MESSAGE_CHARS:
        message = message[: MESSAGE_CHARS - 3] + "..."
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith(("<", _TFSHARDS))
    ]
    mine = [f for f in frames if not f.filename.startswith(_INSTALLED)]
    last = (mine or frames)[-1:]
    where = "".join(f" ({os.path.basename(f.filename)}:{f.lineno})" for f in last)
    return f"{type(exc).__name__}: {message}{where}"


def build_model(
    name: str,
    *,
    image_size: int,
    channels: int,
    classes: int,
    model_args: Mapping[str, Any] | None = None,
) -> Any:
    """Build model ``name`` (a ``keras.Model``) under the current dtype policy.

    A user's ``package.module:function`` is called as
    ``function((image_size, image_size, channels), classes, **model_args)`` and
    must return an uncompiled ``keras.Model`` with float32 images in [0, 1] in
    and ``classes`` probabilities out (end it with a softmax).

    Args:
        name: a key of :data:`MODELS`, or ``package.module:function``.
        image_size: input height and width in pixels.
        channels: input channels (1 for grayscale, 3 for RGB).
        classes: number of output classes, >= 2.
        model_args: keyword arguments for a user's function (built-ins take none).

    Raises:
        ConfigError: a bad name, size or ``model_args``; a user's function that
            raises (its exception and line, on one line) or returns no fitting model.
    """
    model_spec(name, image_size)
    if channels < 1:
        raise ConfigError(f"channels must be >= 1, got {channels}")
    if classes < 2:
        raise ConfigError(f"a classifier needs at least 2 classes, got {classes}", classes=classes)
    args = dict(model_args or {})
    if not is_user_model(name):
        if args:
            raise ConfigError(
                f"model {name!r} is built in and takes no model_args, got {sorted(args)}"
            )
        return _BUILDERS[name](image_size, channels, classes)
    import keras

    shape = (image_size, image_size, channels)
    builder = load_builder(name)
    try:
        inspect.signature(builder).bind(shape, classes, **args)
    except TypeError as exc:  # a missing or unexpected model_args key
        raise ConfigError(f"model {name!r}: model_args {args}: {exc}", model=name) from None
    except ValueError:  # no signature to check (a builtin): the call says
        pass
    call = ", ".join([repr(shape), str(classes), *(f"{k}={v!r}" for k, v in args.items())])
    try:
        model = builder(shape, classes, **args)
    except Exception as exc:  # a user's code can raise anything; we report it, not hide it
        raise ConfigError(
            f"model {name!r}: {name.partition(':')[2]}({call}) raised {described(exc)}",
            model=name,
        ) from None
    if not isinstance(model, keras.Model):
        raise ConfigError(
            f"model {name!r} must return a keras.Model, got {type(model).__name__}", model=name
        )
    found = tuple(model.output.shape) if hasattr(model, "output") else None
    if found != (None, classes):
        raise ConfigError(
            f"model {name!r} must output (batch, {classes}) probabilities, got {found}",
            model=name,
        )
    _check_probabilities(model, name, shape)
    return model


def _check_probabilities(model: Any, name: str, shape: tuple[int, int, int]) -> None:
    """Refuse a model whose outputs are not probabilities (no softmax at its end): it
    trained without a word into 0.25 accuracy where the same layers with a softmax got
    0.82, since the loss takes probabilities. One forward pass of two images of seeded
    noise in [0, 1] (a blank image made a model that normalises its input divide by 0)."""
    import numpy as np

    images = np.random.default_rng(0).uniform(size=(2, *shape)).astype(np.float32)
    out = np.asarray(model(images, training=False), np.float64)
    if not np.all(np.isfinite(out)):
        raise ConfigError(
            f"model {name!r}: expected class probabilities, found outputs that are not "
            "finite (NaN or inf) for two images of noise in [0, 1]",
            model=name,
        )
    sums = out.sum(axis=1)
    if out.min() >= 0 and np.all(np.abs(sums - 1) < 1e-2):
        return
    raise ConfigError(
        f"model {name!r} must end in a softmax: expected outputs >= 0 that sum to 1 for "
        f"each image, found sums {sums[0]:.4g} and {sums[1]:.4g} (least output "
        f"{out.min():.4g}) for two images of noise in [0, 1]",
        model=name,
    )


def with_input(model: Any, *, image_dtype: str, augment: tuple[str, ...], seed: int) -> Any:
    """``model`` behind what the input needs: uint8 scaling and training-time augmentation.

    ``uint8`` images (a quarter of the bytes float32 sends to a device) are
    scaled to [0, 1] by a ``Rescaling`` layer inside the model. ``flip`` adds a
    random horizontal flip and ``crop`` a random crop of up to 20% of each side
    resized back (``RandomZoom``); both run on the device, in training only, and
    pass images through unchanged at inference. With neither the model is
    returned as it is.
    """
    unknown = sorted(set(augment) - set(AUGMENTATIONS))
    if unknown:
        raise ConfigError(f"augment must be among {AUGMENTATIONS}, got {unknown}")
    if image_dtype == "float32" and not augment:
        return model
    import keras
    from keras import layers

    inputs = keras.Input(model.input.shape[1:], dtype=image_dtype, name="image")
    x = layers.Rescaling(1 / 255, name="scale")(inputs) if image_dtype == "uint8" else inputs
    if "flip" in augment:
        x = layers.RandomFlip("horizontal", seed=seed, name="random_flip")(x)
    if "crop" in augment:
        x = layers.RandomZoom((-0.2, 0.0), seed=seed, fill_mode="reflect", name="random_crop")(x)
    return keras.Model(inputs, model(x), name=model.name)


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


_BUILDERS: dict[str, Callable[[int, int, int], Any]] = {
    "small_cnn": _small_cnn,
    "mobilenet_v3_small": _mobilenet_v3_small,
}
