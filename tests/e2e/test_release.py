"""One version everywhere: `tfshards --version`, the installed metadata and ``_version``.

The slow tests (tests/e2e/test_install.py) build the wheel and the sdist, install
each into a brand-new virtual environment and run a new DVC pipeline from it.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import tfshards
from tfshards import _version


def test_version_is_one_value_in_the_command_the_metadata_and_the_package():
    out = subprocess.run(
        [sys.executable, "-m", "tfshards", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    # The metadata is written at install time from _version.py (pyproject.toml's
    # [tool.setuptools.dynamic]): a mismatch here means "reinstall" (`make install`).
    assert out.stdout.strip() == f"tfshards {metadata.version('tfshards')}"
    assert metadata.version("tfshards") == _version.__version__ == tfshards.__version__
