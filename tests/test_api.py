"""The public API: every exported name resolves, and `import tfshards` stays light."""

from __future__ import annotations

import subprocess
import sys
import types


def test_every_exported_name_resolves_even_after_submodule_imports():
    import tfshards.reading.loader  # also imports the validation modules and friends

    for name in tfshards.__all__:
        assert not isinstance(getattr(tfshards, name), types.ModuleType), name
    assert callable(tfshards.validate_shards) and callable(tfshards.write)
    assert callable(tfshards.split) and callable(tfshards.make_dataset)


def test_import_loads_neither_tensorflow_nor_fsspec():
    code = "import sys, tfshards; print('tensorflow' in sys.modules, 'fsspec' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"]


USER_SCRIPT = """
import tfshards

listing = tfshards.list_files("data/raw")
result = tfshards.write(tfshards.WriteConfig(out="data/shards"), listing)
reveal_type(result)
reveal_type(result.manifest.shards[0].records)
reveal_type(result.reused)
report = tfshards.validate_shards(tfshards.ValidateConfig(manifest="data/manifest.json"))
reveal_type(report)
split = tfshards.split(result.manifest, val_fraction=0.2, seed=0)
dataset = tfshards.make_dataset(split.train, result.manifest, batch_size=8, training=True)
reveal_type(tfshards.make_dataset)
records: str = result.reused  # a real type makes this line an error
"""


def test_type_checkers_see_the_public_api_with_real_types(tmp_path):
    """`mypy --strict` on a user's script sees tfshards' own types, never `Any`."""
    script = tmp_path / "user_script.py"
    script.write_text(USER_SCRIPT)
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    revealed = [line for line in out.stdout.splitlines() if "Revealed type" in line]
    assert len(revealed) == 5, out.stdout
    assert '"tfshards.writing.writer.WriteResult"' in revealed[0]
    assert revealed[1].endswith('"int"') and revealed[2].endswith('"int"'), revealed
    assert '"tfshards.validation.validate.ValidationReport"' in revealed[3]
    assert "def (shards: typing.Sequence[tfshards.shardset.manifest.ShardInfo]" in revealed[4]
    assert not any("Any" in line for line in revealed[:4]), revealed
    assert 'Incompatible types in assignment (expression has type "int"' in out.stdout


def test_all_lists_exactly_the_lazy_names_and_the_errors():
    import tfshards

    errors = {n for n in tfshards.__all__ if n.endswith("Error")}
    assert set(tfshards.__all__) == set(tfshards._LAZY) | errors | {"__version__"}
