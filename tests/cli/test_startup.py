"""What a command imports before it does anything: every DVC stage and every ``--help`` pays it.

A fresh interpreter runs each probe, so the modules counted are exactly those
the command pulled in. The heavy ones each cost 0.1-5 s of start-up (numpy
~0.3 s, fsspec ~0.1 s, pydantic ~0.3 s, TensorFlow 3-5 s) and belong to the
commands that use them, imported when they run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Top-level packages no command may import before it runs.
HEAVY = ("numpy", "tensorflow", "keras", "dvc", "dask", "distributed", "fsspec", "pydantic", "PIL")

PROBE = """
import contextlib, io, json, sys
args = sys.argv[1:]
if args == ["import"]:
    import tfshards.cli
else:
    from tfshards.cli import main
    sys.argv = ["tfshards", *args]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main()
print(json.dumps(sorted(sys.modules)))
"""


def imported(*args: str) -> set[str]:
    """The modules a fresh interpreter holds after ``tfshards ARGS``."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_the_probe_sees_a_heavy_import() -> None:
    # The probe itself: a command that runs has imported its work (validate parses with numpy).
    assert "numpy" in imported("validate", "nowhere/manifest.json")


@pytest.mark.parametrize(("given", "expected"), [(None, "1"), ("3", "3")])
def test_commands_run_blas_on_one_thread_unless_told(given: str | None, expected: str) -> None:
    # numpy's OpenBLAS threads spin on every import (~80 ms of CPU a process on 2 cores).
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    code = "import os, tfshards.cli.write; print(os.environ['OPENBLAS_NUM_THREADS'])"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == expected


def test_a_command_off_a_terminal_imports_no_progress_bar() -> None:
    # DVC runs a stage with stderr to a log: tqdm is imported only to draw a bar.
    modules = imported("validate", "nowhere/manifest.json")
    assert "tfshards.progress" in modules and "tqdm" not in modules


def heavy(modules: set[str]) -> set[str]:
    return {m.partition(".")[0] for m in modules} & set(HEAVY)


@pytest.mark.parametrize(
    "args",
    [
        ("import",),
        ("--version",),
        ("--help",),
        ("list", "--help"),
        ("write", "--help"),
        ("validate", "--help"),
        ("train", "--help"),
        ("diff", "--help"),
        ("show", "--help"),
        ("prune", "--help"),
        ("init", "--help"),
    ],
    ids=" ".join,
)
def test_a_command_imports_nothing_heavy_before_it_runs(args: tuple[str, ...]) -> None:
    assert heavy(imported(*args)) == set()


def commands(modules: set[str]) -> set[str]:
    """The subcommand modules (``tfshards.cli.write`` ...) among ``modules``."""
    return {m for m in modules if m.startswith("tfshards.cli.") and m != "tfshards.cli._common"}


def test_only_the_command_used_is_imported() -> None:
    assert commands(imported("--version")) == set()
    assert commands(imported("list", "--help")) == {"tfshards.cli.list"}
    assert len(commands(imported("--help"))) == 10  # the group's help lists every command


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "stages").glob("*.py")))
def test_a_stage_script_imports_nothing_heavy_for_its_help(script: str) -> None:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", f"stages/{script}", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    names = {line.rpartition("|")[2].strip() for line in done.stderr.splitlines()}
    assert heavy(names) == set()


def test_a_stage_reads_its_params_keys_without_the_round_trip_yaml_loader() -> None:
    # The probe runs in the repository, beside params.yaml: every stage there checks its
    # section's keys. ruamel (its import and pure-Python parse) cost ~0.1 s a stage.
    modules = imported("validate", "nowhere/manifest.json")
    assert (REPO / "params.yaml").is_file() and "yaml" in modules
    assert not {m for m in modules if m.startswith("ruamel")}


def test_validate_imports_crc32c_only_to_compute_a_crc_in_python() -> None:
    # Importing the crc32c package took ~26 ms (importlib.metadata, argparse): 0.325 s ->
    # 0.262 s for a fresh `tfshards validate` of 8 records, whose C loops check every CRC.
    modules = imported("validate", "nowhere/manifest.json")
    assert "tfshards.validation.validate" in modules and "crc32c" not in modules
