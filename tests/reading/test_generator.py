"""from_files gives the elements a serial loop gives, in every mode, and names the file at fault."""

from __future__ import annotations

import collections
import dataclasses
import io
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tfshards.errors import ConfigError, InputError
from tfshards.listing.entry import Entry
from tfshards.listing.listing import Listing, list_files
from tfshards.project.sample import write_synthetic
from tfshards.reading import filesplit, generator, pools

SIZE = 16


# Module-level functions: worker processes import them from this module by name.
def load_image(path: str, label: int) -> tuple[np.ndarray[Any, Any], int]:
    with open(path, "rb") as f:
        image = Image.open(io.BytesIO(f.read())).convert("RGB")
    return np.asarray(image.resize((8, 8)), dtype=np.float32) / 255.0, label


def path_digits(path: str, label: int) -> dict[str, Any]:
    return {"n": np.array([sum(map(ord, path)) % 997], np.int64), "name": path.encode()}


def wrong_shape(path: str, label: int) -> tuple[np.ndarray[Any, Any], int]:
    return np.zeros((3,), np.float32), label


def fails_on_third(path: str, label: int) -> tuple[np.ndarray[Any, Any], int]:
    if path.endswith("000002.jpg"):
        raise ValueError("cannot open")
    return np.zeros((8, 8, 3), np.float32), label


def exits_on_third(path: str, label: int) -> tuple[np.ndarray[Any, Any], int]:
    if path.endswith("000002.jpg"):
        raise SystemExit(3)
    return np.zeros((8, 8, 3), np.float32), label


def interrupts_on_third(path: str, label: int) -> tuple[np.ndarray[Any, Any], int]:
    if path.endswith("000002.jpg"):
        raise KeyboardInterrupt
    return np.zeros((8, 8, 3), np.float32), label


def variable_length(path: str, label: int) -> tuple[np.ndarray[Any, Any], int]:
    return np.arange(label + 1, dtype=np.int64), label


def slow_pid(path: str, label: int) -> np.int64:
    time.sleep(0.02)  # a GIL-bound fn's time, spent in the worker
    return np.int64(os.getpid())


def returns_nothing(path: str, label: int) -> None:
    return None


@pytest.fixture(scope="module")
def listing(tmp_path_factory: pytest.TempPathFactory) -> Listing:
    root = tmp_path_factory.mktemp("files") / "img"
    write_synthetic(str(root), 40, SIZE, classes=4, workers=1)
    return list_files(str(root))


def _image_signature() -> Any:
    import tensorflow as tf

    return (tf.TensorSpec((8, 8, 3), tf.float32), tf.TensorSpec((), tf.int64))


def _serial_loop(listing: Listing, fn: Any) -> list[tuple[np.ndarray[Any, Any], int]]:
    return [fn(str(Path(listing.root) / e.path), e.label) for e in listing.entries]


def _unbatched(ds: Any) -> list[tuple[np.ndarray[Any, Any], int]]:
    out = []
    for images, labels in ds:
        if len(labels.shape) == 0:
            out.append((images.numpy(), int(labels)))
        else:
            out += [(i, int(v)) for i, v in zip(images.numpy(), labels.numpy(), strict=True)]
    return out


def _same(a: list[tuple[np.ndarray[Any, Any], int]], b: list[tuple[Any, int]]) -> bool:
    return len(a) == len(b) and all(
        np.array_equal(x, y) and u == v for (x, u), (y, v) in zip(a, b, strict=True)
    )


# ----------------------------------------------------------------------------- split


def test_split_files_is_deterministic_disjoint_and_never_empty(listing):
    a = filesplit.split_files(listing, 0.1, seed=4)
    assert a == filesplit.split_files(listing, 0.1, seed=4)
    train = {e.path for e in a.train.entries}
    val = {e.path for e in a.val.entries}
    assert len(val) == 4 and not train & val and len(train | val) == 40
    assert a.val.root == listing.root and a.val.labels == listing.labels
    doc = json.loads(a.to_json())
    assert doc["val"]["files"] == 4 and doc["train"]["files"] == 36
    with pytest.warns(UserWarning, match="effective fraction"):
        tiny = filesplit.split_files(listing, 0.001, seed=0)
    assert len(tiny.val.entries) == 1


# ----------------------------------------------------------------------------- modes


@pytest.mark.parametrize("mode", ["serial", "thread", "process"])
@pytest.mark.parametrize("batch_size", [None, 16])
def test_python_modes_give_the_serial_loops_elements_in_order(listing, mode, batch_size):
    ds = generator.from_files(
        listing, load_image, output_signature=_image_signature(), mode=mode, batch_size=batch_size
    )
    assert _same(_unbatched(ds), _serial_loop(listing, load_image))


@pytest.mark.parametrize(("old", "new"), [("threads", "thread"), ("processes", "process")])
def test_old_mode_names_still_work_with_a_deprecation_warning(listing, old, new):
    with pytest.warns(DeprecationWarning, match=f"mode '{old}' is deprecated; use '{new}'"):
        ds = generator.from_files(
            listing, load_image, output_signature=_image_signature(), mode=old
        )
    assert _same(_unbatched(ds), _serial_loop(listing, load_image))


def test_graph_mode_maps_tensorflow_ops(listing):
    import tensorflow as tf

    def tf_load(path: Any, label: Any) -> Any:
        image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        return tf.image.resize(image, (8, 8)) / 255.0, label

    ds = generator.from_files(
        listing, tf_load, output_signature=_image_signature(), mode="graph", batch_size=8
    )
    assert ds.element_spec[0].shape.as_list() == [None, 8, 8, 3]
    got = _unbatched(ds)
    expected = [
        (tf_load(tf.constant(str(Path(listing.root) / e.path)), e.label)[0].numpy(), e.label)
        for e in listing.entries
    ]
    assert _same(got, expected)


def test_graph_mode_rejects_a_function_that_cannot_meet_the_signature(listing):
    import tensorflow as tf

    with pytest.raises(ConfigError, match=r"declares float32 .* fn makes uint8"):
        generator.from_files(
            listing,
            lambda p, label: (tf.zeros((8, 8, 3), tf.uint8), label),
            output_signature=_image_signature(),
            mode="graph",
        )


def test_dict_outputs_and_strings_keep_their_structure(listing):
    import tensorflow as tf

    signature = {"n": tf.TensorSpec((1,), tf.int64), "name": tf.TensorSpec((), tf.string)}
    ds = generator.from_files(
        listing, path_digits, output_signature=signature, mode="process", batch_size=10
    )
    batches = list(ds)
    assert len(batches) == 4 and set(batches[0]) == {"n", "name"}
    names = [n for b in batches for n in b["name"].numpy().tolist()]
    assert names == [str(Path(listing.root) / e.path).encode() for e in listing.entries]


def test_variable_shapes_are_yielded_one_by_one(listing):
    import tensorflow as tf

    signature = (tf.TensorSpec((None,), tf.int64), tf.TensorSpec((), tf.int64))
    ds = generator.from_files(listing, variable_length, output_signature=signature, mode="thread")
    got = [(x.numpy(), int(y)) for x, y in ds]
    assert _same(got, _serial_loop(listing, variable_length))


def test_shuffle_is_seeded_new_each_epoch_and_complete(listing):
    def labels_and_names(seed: int) -> list[list[bytes]]:
        import tensorflow as tf

        signature = {"n": tf.TensorSpec((1,), tf.int64), "name": tf.TensorSpec((), tf.string)}
        ds = generator.from_files(
            listing,
            path_digits,
            output_signature=signature,
            mode="thread",
            shuffle=True,
            seed=seed,
        ).repeat(2)
        names = [x["name"].numpy() for x in ds]
        return [names[:40], names[40:]]

    first, second = labels_and_names(1)
    assert sorted(first) == sorted(second) and len(set(first)) == 40
    assert first != second  # a new order each epoch
    assert labels_and_names(1) == [first, second]
    assert labels_and_names(2)[0] != first


def test_drop_remainder_gives_a_static_batch_dimension(listing):
    ds = generator.from_files(
        listing,
        load_image,
        output_signature=_image_signature(),
        mode="process",
        batch_size=16,
        drop_remainder=True,
    )
    assert ds.element_spec[0].shape.as_list() == [16, 8, 8, 3]
    assert sum(int(y.shape[0]) for _, y in ds) == 32


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("mode", ["serial", "thread", "process"])
def test_output_that_breaks_the_signature_names_the_file(listing, mode):
    import tensorflow as tf

    ds = generator.from_files(
        listing, wrong_shape, output_signature=_image_signature(), mode=mode, batch_size=4
    )
    first = str(Path(listing.root) / listing.entries[0].path)
    with pytest.raises(tf.errors.OpError, match=rf"{first}: output 0: expected float32 of shape"):
        list(ds)


@pytest.mark.parametrize(
    ("value", "dtype", "found"),
    [
        ([300, 300], "uint8", "expected uint8 values in [0, 255], found values from 300 to 300"),
        ([-1, 5], "uint16", "expected uint16 values in [0, 65535], found values from -1 to 5"),
        ([0, 2], "bool", "expected bool values in [0, 1], found values from 0 to 2"),
        (
            [1, 70_000],
            "float16",
            "expected float16 values in [-65504.0, 65504.0], found values from 1 to 70000",
        ),
    ],
)
def test_integers_out_of_the_declared_range_are_refused_not_wrapped(value, dtype, found):
    leaves = [pools.Leaf(dtype, (2,), "")]
    with pytest.raises(InputError, match=r"^a\.jpg: output 0: " + re.escape(found)):
        pools.check_element((np.array(value, np.int64),), leaves, "a.jpg")


def test_a_list_returned_for_one_tensor_says_how_tf_nest_counts_it():
    """([1, 2, 3, 4], label) was "fn returned 5 values, output_signature declares 2"."""
    leaves = [pools.Leaf("int32", (4,), ""), pools.Leaf("int64", (), "")]
    with pytest.raises(InputError) as raised:
        pools.check_element(([1, 2, 3, 4], 0), leaves, "a.jpg")
    assert str(raised.value) == (
        "a.jpg: fn returned 5 values, output_signature declares 2 (a Python list inside the "
        "result is a structure whose every item is a value, as tf.nest flattens it: return "
        "np.asarray(the list) for one tensor)"
    )
    (out, label) = pools.check_element((np.asarray([1, 2, 3, 4]), 0), leaves, "a.jpg")
    assert out.tolist() == [1, 2, 3, 4] and label == 0
    with pytest.raises(InputError, match=r"declares 2$"):  # no list: no hint
        pools.check_element((1, 2, 3), leaves, "a.jpg")


def test_integers_that_fit_the_declared_type_are_cast():
    (out,) = pools.check_element(
        (np.array([0, 255], np.int64),), [pools.Leaf("uint8", (2,), "")], "a"
    )
    assert out.dtype == np.uint8 and out.tolist() == [0, 255]


def test_function_failure_names_the_file(listing):
    import tensorflow as tf

    ds = generator.from_files(
        listing, fails_on_third, output_signature=_image_signature(), mode="thread"
    )
    with pytest.raises(tf.errors.OpError, match=r"000002\.jpg: fails_on_third failed: ValueError"):
        list(ds)


@pytest.mark.parametrize("mode", ["serial", "thread", "process"])
def test_inside_file_errors_a_failing_file_is_the_input_error_itself(listing, mode):
    ds = generator.from_files(
        listing, fails_on_third, output_signature=_image_signature(), mode=mode, batch_size=4
    )
    with pytest.raises(InputError) as info, generator.file_errors():
        list(ds)
    message = str(info.value)
    assert "\n" not in message and message.endswith(
        "fails_on_third failed: ValueError: cannot open"
    )
    assert info.value.path.endswith("000002.jpg")


@pytest.mark.parametrize(
    ("fn", "mode", "said"),
    [
        (exits_on_third, "process", "exits_on_third failed: SystemExit: 3"),
        (exits_on_third, "thread", "exits_on_third failed: SystemExit: 3"),
        (interrupts_on_third, "thread", "interrupts_on_third failed: KeyboardInterrupt: "),
    ],
)
def test_a_function_that_exits_or_interrupts_off_the_main_thread_names_the_file(
    listing, fn, mode, said
):
    """sys.exit() in fn, or a KeyboardInterrupt where no Ctrl-C lands, reached TensorFlow
    as an UnknownError with a screen of traceback and no file named."""
    ds = generator.from_files(listing, fn, output_signature=_image_signature(), mode=mode)
    with pytest.raises(InputError) as info, generator.file_errors():
        list(ds)
    assert str(info.value).endswith(said) and info.value.path.endswith("000002.jpg")


def test_file_errors_lets_other_errors_through():
    import tensorflow as tf

    with pytest.raises(tf.errors.InvalidArgumentError), generator.file_errors():
        tf.debugging.check_numerics(tf.constant([float("nan")]), "not a file's error")


def _fake_listing(root: str, n: int) -> Listing:
    return Listing(root, ("a",), tuple(Entry(f"a/{i:05d}.jpg", 1, 0, "t") for i in range(n)))


def test_processes_cannot_read_memory_files():
    with pytest.raises(ConfigError, match="memory://"):
        generator.from_files(
            _fake_listing("memory://x", 3),
            load_image,
            output_signature=_image_signature(),
            mode="process",
        )


def test_auto_mode_picks_by_what_the_function_is():
    assert generator._resolve_mode("auto", load_image, in_memory=False) == "process"
    assert generator._resolve_mode("auto", load_image, in_memory=True) == "thread"
    assert generator._resolve_mode("auto", lambda p, label: p, in_memory=False) == "thread"


def test_unpicklable_function_cannot_use_processes(listing):
    with pytest.raises(ConfigError, match="pickles"):
        generator.from_files(
            listing, lambda p, label: p, output_signature=_image_signature(), mode="process"
        )


def test_bad_mode_is_rejected(listing):
    with pytest.raises(ConfigError, match="mode must be one of"):
        generator.from_files(listing, load_image, output_signature=None, mode="gpu")


# ----------------------------------------------------------------------------- speed


@pytest.mark.slow
class _InFlight:
    """Counts calls of a waiting function that overlap (how many ran at once, at most)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0

    def __call__(self, path: str, label: int) -> tuple[np.ndarray[Any, Any], int]:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.005)  # waits, as I/O does; the GIL is free meanwhile
        with self.lock:
            self.now -= 1
        return np.array([label], np.int64), label


def test_thread_mode_overlaps_the_calls_of_a_waiting_function():
    """Many calls wait at once (their speed is the bench's business, not a test's)."""
    import tensorflow as tf

    signature = (tf.TensorSpec((1,), tf.int64), tf.TensorSpec((), tf.int64))
    waiting = _InFlight()
    ds = generator.from_files(
        _fake_listing("/nowhere", 200), waiting, output_signature=signature, mode="thread"
    )
    assert sorted(int(y) for _, y in ds) == sorted(
        e.label for e in _fake_listing("/x", 200).entries
    )
    assert waiting.most >= 4, waiting.most


def dies_on_fifth(path: str, label: int) -> tuple[np.ndarray[Any, Any], int]:
    if path.endswith("000004.jpg"):
        os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does
    return np.zeros((8, 8, 3), np.float32), label


def test_killed_worker_is_an_error_not_a_hang(listing):
    import tensorflow as tf

    ds = generator.from_files(
        listing, dies_on_fifth, output_signature=_image_signature(), mode="process"
    )
    with pytest.raises(tf.errors.OpError, match="worker process died"):
        list(ds)
    again = generator.from_files(
        listing, load_image, output_signature=_image_signature(), mode="process"
    )
    assert len(list(again)) == 40  # a fresh pool replaces the broken one


def test_a_dead_worker_under_a_script_hints_at_the_main_guard_it_lacks(monkeypatch, tmp_path):
    """An unguarded script's work starts again in the workers' server, which Python refuses:
    every worker died at once, and the line said only "killed by a signal or out of memory"."""
    import types

    from tfshards.reading import pools

    script = types.ModuleType("__main__")
    script.__file__ = str(tmp_path / "prepare.py")
    monkeypatch.setitem(sys.modules, "__main__", script)
    (tmp_path / "prepare.py").write_text("import tfshards\nds = tfshards.from_files(...)\n")
    assert 'the script has no `if __name__ == "__main__":`' in pools._guard_hint()
    (tmp_path / "prepare.py").write_text("if __name__ == '__main__':\n    main()\n")
    assert pools._guard_hint() == ""  # guarded: a worker died of something else
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))  # a notebook
    assert pools._guard_hint() == ""


def test_never_more_worker_processes_than_tasks(listing):
    """40 files in batches of 20 are 2 tasks per epoch: 2 processes, though 8 were asked for."""
    before = dict(pools._POOLS)
    made = []
    real = pools.Runner.__init__

    def spy(self: pools.Runner, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        made.append(self.workers)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pools.Runner, "__init__", spy)
        ds = generator.from_files(
            listing,
            load_image,
            output_signature=_image_signature(),
            mode="process",
            batch_size=20,
            num_parallel_calls=8,
        )
    assert len(_unbatched(ds)) == 40
    assert made == [2]
    assert 8 not in set(pools._POOLS) - set(before)


def test_a_small_listing_in_process_mode_reaches_every_worker(listing):
    """40 files in one chunk of 64 ran on one process of two; in chunks of 5 both work."""
    import tensorflow as tf

    assert pools.chunk_items(40, 2) == 5 and pools.chunk_items(60, 2) == 8
    assert pools.chunk_items(10_000, 2) == pools.CHUNK_ITEMS and pools.chunk_items(3, 8) == 1
    ds = generator.from_files(
        listing,
        slow_pid,
        output_signature=tf.TensorSpec((), tf.int64),
        mode="process",
        num_parallel_calls=2,
    )
    pids = collections.Counter(int(v) for v in ds)
    assert sum(pids.values()) == 40 and len(pids) == 2, pids


@pytest.mark.parametrize("mode", ["serial", "process"])
def test_a_function_that_returns_none_is_said_so(listing, mode):
    import tensorflow as tf

    ds = generator.from_files(
        listing, returns_nothing, output_signature=_image_signature(), mode=mode
    )
    first = str(Path(listing.root) / listing.entries[0].path)
    message = rf"{first}: fn returned None, output_signature declares 2 values"
    with pytest.raises(tf.errors.OpError, match=message):
        list(ds)


def test_thread_mode_datasets_share_one_pool_of_threads(listing):
    """TensorFlow keeps a from_generator dataset's generator reachable after the dataset is
    gone: a pool per dataset was never shut down (20 datasets held 450 threads)."""
    import gc

    def threads() -> int:
        return sum(t.name.startswith("tfshards-files") for t in threading.enumerate())

    for size in range(1, 7):  # listings of other sizes too: a pool per size grew as well
        part = dataclasses.replace(listing, entries=listing.entries[: size * 6])
        ds = generator.from_files(
            part, load_image, output_signature=_image_signature(), mode="thread"
        )
        assert len(list(ds)) == size * 6
        del ds
        gc.collect()
    assert threads() <= pools.DEFAULT_THREADS
