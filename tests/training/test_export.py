"""The serving export: every file and folder flushed to disk before its rename, the rename after."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest


def test_every_file_and_folder_of_the_export_is_fsynced_and_then_its_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import keras

    from tfshards.training.export import export_serving

    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(2, activation="softmax"),
        ]
    )
    target = tmp_path / "models" / "export"
    stale = target / "variables" / "variables.data-00001-of-00002"  # an earlier export's
    stale.parent.mkdir(parents=True)
    stale.write_text("an older export")
    synced: list[tuple[str, bool]] = []  # (what was fsynced, whether the new export was visible)
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), not stale.exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    export_serving(
        model, str(target), image_size=8, channels=1, image_dtype="float32", labels=["a", "b"]
    )
    staged = re.compile(rf"{re.escape(str(target.parent))}/\.export-[^/]+/model(?:/(.*))?$")
    before = {m[1] or "." for path, visible in synced if not visible if (m := staged.match(path))}
    tree = {str(p.relative_to(target)) for p in target.rglob("*")} | {"."}
    assert not stale.exists() and "saved_model.pb" in tree
    assert tree - before == set(), "written but not fsynced before the rename"
    assert synced[-1] == (str(target.parent), True), "the rename itself is not fsynced"


def test_an_export_path_holding_anything_but_an_earlier_export_is_refused(tmp_path):
    """--export-out . replaced a whole project; a folder of the user's lost its files."""
    from tfshards.errors import ConfigError
    from tfshards.training.outputs import check_target

    check_target(str(tmp_path / "none"))  # no folder: fine
    (tmp_path / "empty").mkdir()
    check_target(str(tmp_path / "empty"))
    earlier = tmp_path / "earlier"
    (earlier / "variables").mkdir(parents=True)
    (earlier / "saved_model.pb").write_bytes(b"x")
    check_target(str(earlier))
    (earlier / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"found 1 entries it did not make \(first: 'keep.txt'\)"):
        check_target(str(earlier))
    (tmp_path / "afile").write_text("mine")
    with pytest.raises(ConfigError, match="found a file; pass another --export-out"):
        check_target(str(tmp_path / "afile"))
    (earlier / "keep.txt").unlink()
    (earlier / "variables" / "variables.index").write_bytes(b"x")
    (earlier / "variables" / "variables.data-00000-of-00001").write_bytes(b"x")
    check_target(str(earlier))  # what an export writes in its folders
    for mine in ("variables/mine.txt", "assets/logo.png"):  # inside its folders: theirs too
        (earlier / mine).parent.mkdir(exist_ok=True)
        (earlier / mine).write_text("mine")
        with pytest.raises(ConfigError, match=rf"entries it did not make \(first: '{mine}'\)"):
            check_target(str(earlier))
        (earlier / mine).unlink()
