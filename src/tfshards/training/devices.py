"""Where training runs: the distribution strategy, its devices, and per-run TensorFlow state."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

from tfshards.errors import ConfigError

STRATEGIES = ("auto", "one", "mirrored", "multi_worker")


def device_name() -> str:
    """``"GPU:0 (<name>)"`` when TensorFlow sees a GPU (steps run there), else ``"CPU"``."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "CPU"
    details = tf.config.experimental.get_device_details(gpus[0])
    return f"GPU:0 ({details.get('device_name', 'unknown')})"


def make_strategy(name: str) -> Any:
    """The ``tf.distribute`` strategy ``name`` stands for.

    ``one``: the default strategy (one device, no copies). ``mirrored``: a
    replica on every local GPU, or, with none, on every logical CPU device
    (one unless ``tf.config.set_logical_device_configuration`` made more, as
    the tests do). ``auto``: mirrored when there are two GPUs or more, else one.
    ``multi_worker``: ``MultiWorkerMirroredStrategy`` over the workers that the
    ``TF_CONFIG`` environment variable names (cluster and task), a replica per
    local GPU (or the CPU) of each; made before any other TensorFlow op runs.
    """
    import tensorflow as tf

    if name == "multi_worker":
        check_tf_config(os.environ.get("TF_CONFIG"))
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if name == "one" or (name == "auto" and len(gpus) < 2):
        return tf.distribute.get_strategy()
    if gpus:
        return tf.distribute.MirroredStrategy([d.name for d in gpus])
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    # NCCL, the default all-reduce, is for GPUs only.
    return tf.distribute.MirroredStrategy(
        cpus, cross_device_ops=tf.distribute.ReductionToOneDevice()
    )


def check_tf_config(text: str | None) -> None:
    """Refuse a ``TF_CONFIG`` that TensorFlow would fail on with a traceback (not JSON, no
    cluster, a task not in it); None or empty: one worker, which is fine.

    Raises:
        ConfigError: one line saying what is wrong with it.
    """
    if not text:
        return
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"TF_CONFIG: expected JSON, found {text[:60]!r} ({exc})") from None
    cluster = doc.get("cluster") if isinstance(doc, dict) else None
    task = doc.get("task") if isinstance(doc, dict) else None
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise ConfigError(
            'TF_CONFIG: expected {"cluster": {"worker": [...]}, "task": {"type": ..., "index": '
            f"...}}}}, found {text[:80]!r}"
        )
    kind, index = task.get("type"), task.get("index")
    hosts = cluster.get(kind)
    if not isinstance(hosts, list) or not isinstance(index, int) or not 0 <= index < len(hosts):
        raise ConfigError(
            f"TF_CONFIG: task {kind!r} {index!r} is not in the cluster (its {kind!r} hosts: "
            f"{hosts!r})"
        )


def worker_of(strategy: Any) -> tuple[int, int]:
    """``(index, count)`` of this worker among the strategy's: ``(0, 1)`` when there is one.

    Index 0 is the chief: the ``chief`` task, or ``worker`` 0 in a cluster without one
    (the order ``MultiWorkerMirroredStrategy`` numbers its input pipelines in).
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return 0, 1
    spec = resolver.cluster_spec().as_dict()
    chiefs = len(spec.get("chief", []))
    count = chiefs + len(spec.get("worker", []))
    if resolver.task_type == "chief":
        return 0, count
    return chiefs + int(resolver.task_id), count


@contextlib.contextmanager
def tf_state(seed: int, *, deterministic: bool, mixed: bool) -> Iterator[None]:
    """Seeds, op determinism and the dtype policy for one run; process-wide, so restored after."""
    import keras
    import tensorflow as tf
    from tensorflow.python.framework import config as tf_config

    policy = keras.mixed_precision.global_policy()
    was_deterministic = tf_config.is_op_determinism_enabled()
    keras.utils.set_random_seed(seed)  # Python, NumPy and TensorFlow
    if deterministic:
        tf.config.experimental.enable_op_determinism()
    keras.mixed_precision.set_global_policy("mixed_float16" if mixed else "float32")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(policy)
        if deterministic and not was_deterministic:
            tf_config.disable_op_determinism()


def no_deterministic_kernel(
    model: str, device: str, exc: Exception, *, jit_compile: bool
) -> ConfigError:
    """Op determinism makes TensorFlow refuse ops it cannot run deterministically
    (seen: MaxPool gradients under XLA): the error says which option to change."""
    fix = "deterministic false" + (" or jit_compile false" if jit_compile else "")
    return ConfigError(
        f"model {model!r} uses an op with no deterministic implementation "
        f"on {device}{' under XLA' if jit_compile else ''} "
        f"({str(exc).splitlines()[0]}); use {fix}",
        model=model,
    )
