"""Read YAML as plain dicts, lists and strings with libyaml, for the look-ups every stage runs.

:mod:`tfshards.project.yamlfile` loads round-trip (comments, order, quoting) for
the files ``init`` edits. A stage only looks things up, on every run: its
section's keys in ``params.yaml`` and, for ``write``, its manifest's md5 in
``dvc.lock`` (twice: the workspace's and HEAD's). Measured on the demo's files
(1,466-line ``dvc.lock``), CPU: the round-trip loader took 74-110 ms for
``params.yaml`` and 166-192 ms for the two locks, plus ~100 ms to import; libyaml
takes 3-15 ms in all.

Nothing is typed: every scalar stays the string written (``yes`` is no boolean,
as in the YAML 1.2 that DVC reads, and ``1`` is ``"1"``). Aliases are shared,
never expanded, and a merge key (``<<``) stays a key.
"""

from __future__ import annotations

from typing import Any


def read(path: str) -> Any:
    """The document at ``path``; None when it is missing or not YAML this can read."""
    try:
        with open(path, "rb") as f:
            return _load(f)
    except OSError:
        return None


def parse(text: str) -> Any:
    """The document ``text`` holds; None when it is not YAML this can read."""
    return _load(text)


def _load(stream: Any) -> Any:
    import yaml

    loader = getattr(yaml, "CBaseLoader", yaml.BaseLoader)  # without libyaml: the same, slower
    try:
        return yaml.load(stream, Loader=loader)  # builds only str, dict and list
    except (ValueError, RecursionError, yaml.YAMLError):
        return None
