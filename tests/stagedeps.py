"""dvc.yaml's ``src/`` deps against what each stage's script imports: report, or fix in place.

``python tests/stagedeps.py`` prints each stage's missing and stray deps (exit 1
if any); ``--fix`` rewrites dvc.yaml: stray ``src/`` lines go, missing ones
follow the stage's last ``src/`` line (``make deps``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from importgraph import Edge, closure, edges, graph

# Modules that read files beside them (a change there can change bytes): the compiled
# extension's C sources, the bundled digits.
FILES_BESIDE = {
    "src/tfshards/format/native.py": "src/tfshards/format/_native*.[ch]",
    "src/tfshards/project/sample.py": "src/tfshards/project/digits.txt",
}
SCRIPT = re.compile(r"python (stages/\S+\.py)")
STAGE_LINE = re.compile(r"^  ([\w-]+):\s*$")
SRC_DEP_LINE = re.compile(r"^(\s+)- (src/\S+)\s*$")


def script_of(stage: dict) -> str | None:
    """The ``stages/*.py`` script a stage's cmd runs (repo-relative), or None."""
    found = SCRIPT.search(stage["cmd"])
    return found[1] if found else None


def needed(repo: Path, script: str, imports: dict[str, list[Edge]]) -> set[str]:
    """Repo-relative source files of every module ``script`` loads (``__init__.py`` left out),
    from ``imports`` (:func:`importgraph.graph` of ``repo/src``)."""
    src = repo / "src"
    starts = {e.target for e in edges("__main__", repo / script, set(imports))}
    starts |= {"tfshards"} if starts else set()  # run before any of its modules
    files = set()
    for name in closure(starts, imports):
        path = src / name.replace(".", "/")
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        files.add(path.relative_to(repo).as_posix())
    for module, pattern in FILES_BESIDE.items():
        if module in files:
            files |= {p.relative_to(repo).as_posix() for p in sorted(repo.glob(pattern))}
    return {f for f in files if not f.endswith("__init__.py")}  # a docstring and __all__


def check(dvc_yaml: Path) -> dict[str, tuple[list[str], list[str]]]:
    """Per stage that runs a script: (deps missing, ``src/`` deps its script never loads)."""
    repo = dvc_yaml.parent
    imports = graph(repo / "src")  # ~0.8 s: once for every stage
    found = {}
    for name, stage in yaml.safe_load(dvc_yaml.read_text())["stages"].items():
        script = script_of(stage)
        if script is None:
            continue
        need, deps = needed(repo, script, imports), set(stage["deps"])
        stray = {d for d in deps if d.startswith("src/")} - need
        found[name] = (sorted(need - deps), sorted(stray))
    return found


def fix(dvc_yaml: Path) -> bool:
    """Rewrite ``dvc_yaml`` so every stage's ``src/`` deps are what it loads; True if changed."""
    wrong = check(dvc_yaml)
    text = dvc_yaml.read_text()
    out: list[str] = []
    last_src: dict[str, tuple[int, str]] = {}  # stage -> (line after its last src/ dep, indent)
    stage = None
    for line in text.splitlines(keepends=True):
        if m := STAGE_LINE.match(line):
            stage = m[1]
        dep = SRC_DEP_LINE.match(line)
        if dep and stage in wrong and dep[2] in wrong[stage][1]:
            continue
        out.append(line)
        if dep and stage in wrong:
            last_src[stage] = (len(out), dep[1])
    for name, (at, indent) in sorted(last_src.items(), key=lambda item: -item[1][0]):
        out[at:at] = [f"{indent}- {missing}\n" for missing in wrong[name][0]]
    dvc_yaml.write_text("".join(out))
    return "".join(out) != text


def main(argv: list[str]) -> int:
    dvc_yaml = Path(__file__).resolve().parents[1] / "dvc.yaml"
    if "--fix" in argv and fix(dvc_yaml):
        print(f"{dvc_yaml}: deps resynced")
    bad = 0
    for name, (missing, stray) in check(dvc_yaml).items():
        bad += bool(missing or stray)
        print(f"{name}: missing {missing or '-'}, stray {stray or '-'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
