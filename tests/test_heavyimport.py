"""tfshards.heavyimport: the collector paused for the import; what is alive frozen after in a
command's own process, never in a library caller's."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfshards import heavyimport

MODULE = """
import gc
COLLECTING = gc.isenabled()
"""


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"heavy_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(heavyimport, "_OWN", [False])
    gc.unfreeze()
    yield name
    sys.modules.pop(name, None)


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_a_library_callers_objects_stay_collectable(module):
    """A caller's cycle alive at the import is freed after it: a freeze had pinned it."""
    mine = _Cycle()
    gone = weakref.ref(mine)
    heavyimport.load(module)
    assert sys.modules[module].COLLECTING is False  # paused for the import
    assert gc.isenabled() and gc.get_freeze_count() == 0
    del mine
    gc.collect()
    assert gone() is None


def test_a_commands_process_freezes_what_lives_after_the_import(module):
    heavyimport.own_process()
    heavyimport.load(module)
    assert sys.modules[module].COLLECTING is False
    assert gc.isenabled()  # on again after
    assert gc.get_freeze_count() > 1000  # the interpreter's objects, and the module's


def test_a_collector_paused_before_stays_paused_and_a_loaded_module_is_not_imported_again(module):
    gc.disable()
    try:
        heavyimport.load(module)
        assert not gc.isenabled()
    finally:
        gc.enable()
    sys.modules[module].COLLECTING = "kept"
    heavyimport.load(module)
    assert sys.modules[module].COLLECTING == "kept"


def test_a_missing_module_raises_and_leaves_the_collector_on(module):
    with pytest.raises(ImportError):
        heavyimport.load("tfshards_no_such_module")
    assert gc.isenabled()
