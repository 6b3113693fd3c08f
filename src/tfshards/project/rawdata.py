"""Put a repository's local raw folder under DVC (``dvc add``), so images never land in git."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tfshards.errors import ConfigError
from tfshards.project import yamlfile


def track(directory: Path, root: str) -> bool:
    """``dvc add root`` unless DVC already tracks it; True when it ran.

    Skipped for a root outside ``directory``, one that a ``<root>.dvc`` file
    already tracks, and one that a stage of ``dvc.yaml`` writes (a sample or
    import stage: DVC tracks it as that stage's out).

    Raises:
        ConfigError: ``dvc add`` failed (e.g. git already tracks the images),
            with DVC's reason and how to fix it.
    """
    rel = _to_add(directory, root)
    if rel is None:
        return False
    done = subprocess.run(
        [sys.executable, "-m", "dvc", "add", rel],  # --quiet would silence its ERROR line too
        cwd=directory,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        said = (done.stderr + done.stdout).splitlines()
        lines = [line.strip() for line in said if line.strip()]
        why = next((line for line in lines if line.startswith("ERROR")), lines[-1] if lines else "")
        why = why.removeprefix("ERROR:").strip() or f"exit status {done.returncode}"
        raise ConfigError(
            f"{rel}: dvc add failed ({why[:300]}); if git tracks the "
            f"images, run `git rm -r --cached {rel}`, then `dvc add {rel}`",
            path=rel,
            step="dvc add",
        )
    return True


def _to_add(directory: Path, root: str) -> str | None:
    """``root`` relative to ``directory`` where :func:`track` runs ``dvc add`` on it; None
    for a root outside, one a ``<root>.dvc`` tracks, one a stage of ``dvc.yaml`` writes."""
    rel = os.path.relpath(os.path.abspath(root), directory)
    if rel.startswith(".."):
        return None
    if (directory / f"{rel}.dvc").exists() or rel in _stage_outs(directory / "dvc.yaml"):
        return None
    return rel


def check_links(directory: Path, root: str) -> None:
    """Refuse, before init writes a file, a raw folder ``dvc add`` would refuse or change:
    a linked folder (DVC adds no file inside one: init stopped half-way, dvc.yaml and
    params.yaml written) and a link inside it (``dvc add`` stores the target's bytes and
    puts a file in the link's place: a user's link became a copy, without a word).

    Raises:
        ConfigError: naming the link and what to do instead.
    """
    rel = _to_add(directory, root)
    if rel is None or not os.path.lexists(directory / rel):
        return
    linked = next((p for p in _parts(directory, rel) if p.is_symlink()), None)
    if linked is not None:
        target = os.path.realpath(linked)
        raise ConfigError(
            f"{linked.relative_to(directory)}: a link to {target}; DVC tracks no folder "
            f"behind a link (`dvc add` refuses it): run `tfshards init --root {target}` to "
            f"list the images where they are, or move them into {rel}",
            path=rel,
            step="dvc add",
        )
    for folder, folders, files in os.walk(directory / rel):
        for name in sorted([*folders, *files]):
            path = Path(folder, name)
            if path.is_symlink():
                raise ConfigError(
                    f"{path.relative_to(directory)}: a symbolic link; `dvc add {rel}` would "
                    "store its target's bytes and put a file in its place: replace the "
                    f"links in {rel} with their files (`cp -L`), or `dvc add {rel}` yourself "
                    "and run `tfshards init` again",
                    path=str(path),
                    step="dvc add",
                )


def _parts(directory: Path, rel: str) -> list[Path]:
    """``directory / rel`` and each folder between them, outermost first."""
    parts = Path(rel).parts
    return [directory.joinpath(*parts[: i + 1]) for i in range(len(parts))]


def check_not_in_git(directory: Path, root: str) -> None:
    """Refuse, before init writes a file, a raw folder git already tracks: ``dvc add`` of
    it fails after dvc.yaml, params.yaml and .gitignore were written.

    Raises:
        ConfigError: naming a tracked file and the command that untracks the folder.
    """
    rel = os.path.relpath(os.path.abspath(root), directory)
    if rel.startswith("..") or not (directory / rel).exists():
        return
    done = subprocess.run(
        ["git", "ls-files", "-z", "--", rel],
        cwd=directory,
        capture_output=True,
        check=False,
    )
    tracked = [p for p in done.stdout.split(b"\0") if p] if done.returncode == 0 else []
    if tracked:
        first = tracked[0].decode("utf-8", "replace")
        raise ConfigError(
            f"{rel}: git tracks {len(tracked)} files there ({first}); raw data belongs to DVC: "
            f"run `git rm -r --cached {rel}`, then `tfshards init` again",
            path=rel,
            step="dvc add",
        )


def _stage_outs(dvc_yaml: Path) -> set[str]:
    """The paths the stages of ``dvc_yaml`` write (their ``outs``), normalized."""
    if not dvc_yaml.exists():
        return set()
    stages = yamlfile.plain(yamlfile.load(dvc_yaml)).get("stages") or {}
    outs: set[str] = set()
    for stage in stages.values() if isinstance(stages, dict) else ():
        for out in stage.get("outs", []) if isinstance(stage, dict) else ():
            name = next(iter(out)) if isinstance(out, dict) else out
            outs.add(os.path.normpath(str(name)))
    return outs


__all__ = ["check_links", "check_not_in_git", "track"]
