"""``tfshards doctor``: what this installation runs on, for a bug report or a slow run.

Versions come from the installed distributions' metadata (importlib.metadata),
so nothing heavy is imported for them; only the device list imports
TensorFlow (3-5 s), and only where it is installed.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from tfshards import heavyimport
from tfshards._version import __version__

# Every distribution that installs the `tensorflow` module, in the order a user
# most likely has them (the extras install tensorflow-cpu or tensorflow).
TENSORFLOW = ("tensorflow-cpu", "tensorflow", "tf-nightly", "tensorflow-macos", "intel-tensorflow")
# Distributions tfshards works with, by what they are for: name -> distributions.
PACKAGES = {
    "dvc": ("dvc", "dvclive", "dvc-s3", "dvc-gs"),
    "fsspec": ("fsspec", "s3fs", "gcsfs"),
    "dask": ("dask", "distributed"),
    "numpy": ("numpy", "pillow", "keras"),
}


def _version(dist: str) -> str | None:
    from importlib import metadata  # 20 ms that every other command need not pay

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _installed(dists: tuple[str, ...]) -> str:
    """``name version`` of each installed distribution, ``name -`` for a missing one."""
    return ", ".join(f"{d} {_version(d) or '-'}" for d in dists)


def _tfshards() -> str:
    where = Path(__file__).resolve().parents[1]
    meta = _version("tfshards")
    if meta is None:
        return f"{__version__} at {where} (no installed metadata: run from a source tree)"
    if meta != __version__:
        return f"{__version__} at {where}, but the installed metadata says {meta}: reinstall"
    return f"{__version__} at {where}"


def _loops() -> str:
    """Where the compiled loops came from, and the libcrypto they run SHA-256 with."""
    from tfshards.format import native

    if native.NATIVE is None:
        why = native.MISSING or "off (TFSHARDS_PURE_PYTHON is set)"
        return f"Python loops; the compiled loops are {why}"
    so = Path(str(getattr(native.NATIVE, "__file__", "?")))
    # auditwheel copies the libraries a wheel links into <package>.libs beside it.
    vendored = sorted(p.name for p in so.parents[2].glob("tfshards.libs/*"))
    crypto = f"bundled {', '.join(vendored)}" if vendored else "the system's libcrypto"
    return f"compiled, from {so} (SHA-256: {crypto})"


def _devices() -> str:
    """CPUs this process may use and, where TensorFlow is installed, what it sees."""
    from tfshards.processes import cpu_count

    cpus = f"{cpu_count()} CPUs usable of {os.cpu_count()}"
    if not any(_version(d) for d in TENSORFLOW):
        return f"{cpus}; GPUs unknown (TensorFlow is not installed)"
    try:
        heavyimport.load("tensorflow")
        import tensorflow as tf

        found = [
            d.name.removeprefix("/physical_device:") for d in tf.config.list_physical_devices()
        ]
    except (ImportError, OSError, RuntimeError) as exc:  # installed but broken: say so
        return f"{cpus}; TensorFlow failed to start: {' '.join(str(exc).split())}"
    gpus = [d for d in found if d.startswith("GPU")]
    return f"{cpus}; TensorFlow sees {', '.join(found)}" + ("" if gpus else " (no GPU)")


def _caches() -> Iterator[tuple[str, str]]:
    from tfshards import cachedir
    from tfshards.listing.hashcache import default_path

    hashes = default_path()
    if hashes is None:
        yield "hash cache", "off (TFSHARDS_HASH_CACHE=none)"
    else:
        size = os.path.getsize(hashes) if os.path.isfile(hashes) else None
        yield "hash cache", hashes + (f" ({size} bytes)" if size is not None else " (not made yet)")
    yield "shard cache", cachedir.root()


def report(devices: bool = True) -> Iterator[tuple[str, str]]:
    """Each line of the report as (what, value)."""
    yield "tfshards", _tfshards()
    yield "python", f"{platform.python_version()} at {sys.executable}"
    libc = " ".join(platform.libc_ver())
    yield "platform", f"{platform.system()} {platform.machine()}" + (f", {libc}" if libc else "")
    yield "loops", _loops()
    tf = [f"{d} {_version(d)}" for d in TENSORFLOW if _version(d)]
    yield "tensorflow", ", ".join(tf) or "not installed (pip install 'tfshards[cpu]')"
    for name, dists in PACKAGES.items():
        yield name, _installed(dists)
    yield from _caches()
    if devices:
        yield "devices", _devices()


def doctor_command(
    devices: Annotated[
        bool,
        typer.Option(help="List TensorFlow's devices (imports TensorFlow: a few seconds)."),
    ] = True,
) -> None:
    """Print what this installation runs on: versions, compiled loops, caches, devices.

    Versions are read from the installed packages' metadata; a missing optional
    package shows as `-`. Paste the output into a bug report.
    """
    for what, value in report(devices):
        typer.echo(f"{what + ':':<12} {value}")
