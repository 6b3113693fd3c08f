"""A multi-worker run's roles: which worker is the chief, and where a non-chief writes."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tfshards.errors import ConfigError
from tfshards.training import workerrole
from tfshards.training.checkpoint import MARKER, STATE
from tfshards.training.devices import worker_of
from tfshards.training.trainconfig import TrainConfig


class _Spec:
    def __init__(self, spec: dict[str, list[str]]) -> None:
        self.spec = spec

    def as_dict(self) -> dict[str, list[str]]:
        return self.spec


def _strategy(spec: dict[str, list[str]], task_type: str | None, task_id: int | None) -> object:
    resolver = SimpleNamespace(
        cluster_spec=lambda: _Spec(spec), task_type=task_type, task_id=task_id
    )
    return SimpleNamespace(cluster_resolver=resolver)


@pytest.mark.parametrize(
    ("spec", "task", "expected"),
    [
        ({}, (None, None), (0, 1)),
        ({"worker": ["a:1", "b:1", "c:1"]}, ("worker", 0), (0, 3)),
        ({"worker": ["a:1", "b:1", "c:1"]}, ("worker", 2), (2, 3)),
        ({"chief": ["a:1"], "worker": ["b:1", "c:1"]}, ("chief", 0), (0, 3)),
        ({"chief": ["a:1"], "worker": ["b:1", "c:1"]}, ("worker", 0), (1, 3)),
    ],
)
def test_the_chief_is_worker_0_and_the_others_follow_in_tf_config_order(spec, task, expected):
    assert worker_of(_strategy(spec, *task)) == expected


def test_the_default_strategy_is_one_worker():
    assert worker_of(SimpleNamespace()) == (0, 1)


def test_the_chief_writes_where_it_was_told(tmp_path):
    config = TrainConfig(checkpoint_dir=str(tmp_path / "ckpt"))
    assert workerrole.worker_config(config, (0, 2)) == (config, None)


def test_a_non_chief_writes_only_in_its_own_folder_and_starts_from_the_chiefs_checkpoint(
    tmp_path: Path,
):
    chief = tmp_path / "ckpt"
    chief.mkdir()
    for name, text in ((MARKER, "{}"), (STATE, json.dumps({"step": 8})), ("epoch-1.index", "x")):
        (chief / name).write_text(text)
    config = TrainConfig(
        checkpoint_dir=str(chief),
        metrics=str(tmp_path / "m.json"),
        export_out=str(tmp_path / "export"),
    )
    own, folder = workerrole.worker_config(config, (1, 2))
    try:
        assert folder is not None and not folder.startswith(str(tmp_path))
        for name in ("metrics", "model_out", "export_out", "checkpoint_dir"):
            assert str(getattr(own, name)).startswith(folder + "/"), name
        assert own.live_dir is None and own.split_out is None
        assert own.settings() == config.settings()
        copied = sorted(p.name for p in Path(str(own.checkpoint_dir)).iterdir())
        assert copied == sorted([MARKER, STATE, "epoch-1.index"])
    finally:
        workerrole.remove(folder)
    assert not Path(folder).exists()
    assert sorted(p.name for p in chief.iterdir()) == sorted([MARKER, STATE, "epoch-1.index"])


def test_multi_worker_is_a_strategy():
    assert TrainConfig(strategy="multi_worker").strategy == "multi_worker"
    with pytest.raises(ConfigError, match="strategy must be one of"):
        TrainConfig(strategy="parameter_server")


class _TwoWorkers:
    """A strategy whose other worker resumes at ``other``: its all-reduce adds that in."""

    num_replicas_in_sync = 2

    def __init__(self, other: int) -> None:
        self.other = other

    def run(self, fn):
        return fn()

    def reduce(self, op, value, axis):
        import tensorflow as tf

        return value + tf.constant([self.other, self.other**2], tf.float64)


def test_workers_resuming_at_other_steps_all_stop_with_one_error():
    workerrole.check_same_step(_TwoWorkers(8), 8, "ckpt")
    workerrole.check_same_step(_TwoWorkers(0), 0, "ckpt")
    with pytest.raises(ConfigError, match="resume at different steps"):
        workerrole.check_same_step(_TwoWorkers(0), 8, "ckpt")
    with pytest.raises(ConfigError, match="resume at different steps"):
        workerrole.check_same_step(_TwoWorkers(8), 0, "ckpt")
