"""Run git, dvc and tfshards as a user would, in a temporary repository (test helper)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent  # dvc, tfshards and python of this environment


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 900) -> str:
    """Run ``cmd`` in ``cwd``; its stdout + stderr. A non-zero exit fails the test, printing both.

    ``env`` is added to this process's environment less fsspec's own
    FSSPEC_S3_ENDPOINT_URL (a test that wants S3 names its endpoint itself).
    """
    full_env = {
        **{k: v for k, v in os.environ.items() if k != "FSSPEC_S3_ENDPOINT_URL"},
        **(env or {}),
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "DVC_NO_ANALYTICS": "true",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    result = subprocess.run(
        cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{cmd}: {result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr
