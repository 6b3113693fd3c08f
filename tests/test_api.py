"""The public API: every exported name resolves, and `import tfshards` stays light."""

from __future__ import annotations

import subprocess
import sys
import types


def test_every_exported_name_resolves_even_after_submodule_imports():
    import tfshards.loader  # also imports tfshards.validate and friends as modules

    for name in tfshards.__all__:
        assert not isinstance(getattr(tfshards, name), types.ModuleType), name
    assert callable(tfshards.validate_shards) and callable(tfshards.write)
    assert callable(tfshards.split) and callable(tfshards.make_dataset)


def test_import_loads_neither_tensorflow_nor_fsspec():
    code = "import sys, tfshards; print('tensorflow' in sys.modules, 'fsspec' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"]
