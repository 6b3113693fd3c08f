"""What a user is told about the installation: `tfshards doctor`, and the one-line note when
the compiled loops are missing. Real processes, with the fault planted in them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfshards._version import __version__

SRC = Path(__file__).resolve().parents[2] / "src"
NOTE = "note: tfshards' compiled loops (tfshards.format._native)"

# Runs the command line in a process where importing the compiled loops fails as it
# would on an install without them: ModuleNotFoundError (never built), or another
# ImportError (built, but a library it links is missing).
_BLOCKED = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "tfshards.format._native":
            if {broken}:
                raise ImportError("libcrypto.so.3: cannot open shared object file")
            raise ModuleNotFoundError(name=name)
sys.meta_path.insert(0, Block())
sys.argv[0] = "tfshards"
from tfshards.cli import main
main()
"""


def _tfshards(
    *args: str, blocked: bool = False, broken: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "TFSHARDS_PURE_PYTHON"}
    full.update(PYTHONPATH=str(SRC), **(env or {}))
    code = ["-c", _BLOCKED.format(broken=broken)] if blocked or broken else ["-m", "tfshards"]
    return subprocess.run(
        [sys.executable, *code, *args], capture_output=True, text=True, env=full, timeout=300
    )


def _sample(out: Path, **kw: bool) -> subprocess.CompletedProcess[str]:
    args = ("sample", "synthetic", str(out), "--count", "4", "--size", "8", "--workers", "1")
    return _tfshards(*args, **kw)


def test_missing_compiled_loops_are_announced_once_on_stderr_with_how_to_get_them(tmp_path):
    done = _sample(tmp_path / "raw", blocked=True)
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if line.startswith(NOTE)]
    assert len(notes) == 1, done.stderr
    assert "are not installed, so the Python loops run" in notes[0]
    assert "install the tfshards wheel" in notes[0] and "make dist" in notes[0]
    assert NOTE not in done.stdout


def test_compiled_loops_that_fail_to_load_are_announced_with_the_reason(tmp_path):
    done = _sample(tmp_path / "raw", broken=True)
    assert done.returncode == 0, done.stderr
    (note,) = [line for line in done.stderr.splitlines() if line.startswith(NOTE)]
    assert "are installed but cannot be loaded (libcrypto.so.3: cannot open shared object" in note


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["sample", "synthetic", "--help"]])
def test_help_and_version_say_nothing_of_the_loops(args):
    done = _tfshards(*args, blocked=True)
    assert done.returncode == 0, done.stderr
    assert NOTE not in done.stderr + done.stdout


def test_python_loops_asked_for_are_not_announced(tmp_path):
    done = _tfshards(
        "sample", "synthetic", str(tmp_path / "raw"), "--count", "4", "--size", "8",
        "--workers", "1", env={"TFSHARDS_PURE_PYTHON": "1"},
    )  # fmt: skip
    assert done.returncode == 0 and NOTE not in done.stderr, done.stderr


def test_the_library_alone_says_nothing_when_the_loops_are_missing():
    code = (
        "import sys\n"
        + _BLOCKED.split("sys.argv")[0].split("import sys\n", 1)[1]
        + "import tfshards.format.native as n\n"
        "import tfshards.cli._common\n"  # importing the CLI's helpers announces nothing either
        "print(n.NATIVE, n.MISSING)\n"
    ).format(broken=False)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("TFSHARDS_PURE_PYTHON", None)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None not installed" and done.stderr == ""


def _fields(stdout: str) -> dict[str, str]:
    return {
        k.strip(): v.strip() for k, _, v in (line.partition(":") for line in stdout.splitlines())
    }


def test_doctor_reports_versions_loops_caches_and_devices(tmp_path):
    cache = tmp_path / "hashes.sqlite"
    done = _tfshards("doctor", env={"TFSHARDS_HASH_CACHE": str(cache), "TFSHARDS_CACHE": "/c"})
    assert done.returncode == 0, done.stderr
    found = _fields(done.stdout)
    assert found["tfshards"].startswith(f"{__version__} at {SRC / 'tfshards'}")
    assert found["python"].startswith(f"{sys.version.split()[0]} at {sys.executable}")
    from importlib.metadata import version

    assert (
        f"dvc {version('dvc')}" in found["dvc"] and f"fsspec {version('fsspec')}" in found["fsspec"]
    )
    assert "s3fs" in found["fsspec"] and "gcsfs" in found["fsspec"]
    assert f"dask {version('dask')}" in found["dask"]
    assert found["hash cache"] == f"{cache} (not made yet)"
    assert found["shard cache"] == "/c"
    from tfshards.format import native

    if native.NATIVE is not None:  # the same module this process loaded
        assert found["loops"].startswith(f"compiled, from {native.NATIVE.__file__} (SHA-256: ")
    assert found["devices"].startswith(f"{len(os.sched_getaffinity(0))} CPUs usable")
    assert "TensorFlow sees CPU:0" in found["devices"]  # TensorFlow was imported to list them
    assert NOTE not in done.stderr


def test_doctor_without_the_loops_says_python_loops_and_why():
    done = _tfshards("doctor", "--no-devices", blocked=True)
    assert done.returncode == 0, done.stderr
    found = _fields(done.stdout)
    assert found["loops"] == "Python loops; the compiled loops are not installed"
    assert "devices" not in found
    assert NOTE not in done.stderr  # its own line says it; no second note
