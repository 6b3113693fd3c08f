"""Merge the tfshards pipeline into a repository's dvc.yaml and params.yaml, keeping the rest.

Both files go through a round-trip YAML parser, so the user's stages, params,
comments and key order survive. What ``tfshards init`` may replace is only what
it wrote: a stage whose command runs ``tfshards``, and (with ``force``) the
params the user named on its command line. A mapping or list shared through
a YAML anchor is never changed (the change would show under every alias).
Everything is checked before anything is written, and each file is replaced
atomically and durably, through a symlink, with its permission bits kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import fsspec.utils
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from tfshards.errors import ConfigError
from tfshards.project import pipeline, rawdata, yamlfile
from tfshards.project.yamlfile import dump, load, plain, save, to_yaml

PROGRAM = "tfshards"


def program(version: str) -> Callable[[str], str]:
    """The command prefix of a stage in a user's repository: pinned to ``version``.

    The version is part of each command, so moving the pipeline to another
    tfshards (``tfshards init --force``) changes every command and DVC re-runs
    every stage: an upgrade that changes shard bytes can never hide behind an
    up-to-date ``dvc.lock``.
    """
    return lambda stage: f"{PROGRAM} --pipeline-version {version} {stage}"


@dataclass
class Changes:
    """What a merge did, for the one-line report of each file."""

    added: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    reworded: list[str] = field(default_factory=list)  # keys whose comment init updated
    # Sections that held keys of the user's when init added tfshards' params to them.
    shared: dict[str, list[str]] = field(default_factory=dict)

    def summary(self, what: str) -> str:
        """E.g. ``added stages list, write; kept stages train``."""
        parts = [
            f"{verb} {what} {', '.join(names)}"
            for verb, names in (
                ("added", self.added),
                ("replaced", self.replaced),
                ("kept", self.unchanged),
                ("removed", self.removed),
                ("updated the comment of", self.reworded),
            )
            if names
        ]
        return "; ".join(parts)


def check_repository(directory: Path) -> None:
    """Fail with the set-up step that is missing: ``git init``, then ``dvc init``."""
    here = directory.resolve()
    if not any((p / ".git").exists() for p in (here, *here.parents)):
        raise ConfigError(f"{here}: not a git repository: run `git init` first", step="git init")
    if not any((p / ".dvc").is_dir() for p in (here, *here.parents)):
        raise ConfigError(f"{here}: not a DVC repository: run `dvc init` first", step="dvc init")


def check_backend(url: str) -> None:
    """Fail now, not in the middle of ``dvc repro``, when ``url``'s filesystem is not installed."""
    protocol = fsspec.utils.get_protocol(url)
    try:
        fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError) as exc:
        extra = {"s3": " (pip install 'tfshards[s3]')", "gs": " (pip install 'tfshards[gcs]')"}
        raise ConfigError(
            f"{url}: no filesystem for {protocol}://{extra.get(protocol, '')}: {exc}", url=url
        ) from None


def command(stage: Any) -> Any:
    """A loaded stage's ``cmd`` (None when the stage is not a mapping)."""
    return stage.get("cmd") if isinstance(stage, Mapping) else None


def is_ours(stage: Any) -> bool:
    """True for a stage ``tfshards init`` wrote (its command runs ``tfshards``)."""
    cmd = command(stage)
    return isinstance(cmd, str) and cmd.split()[:1] == [PROGRAM]


def check_own(document: CommentedMap, node: Any, name: str, *, path: str) -> None:
    """Refuse to change ``node`` (the value of ``name``) when aliases share it.

    Keys added to an anchored mapping appear under every alias of it; the
    user's anchor is theirs to split, so the line says how.
    """
    places = yamlfile.references(document, node)
    if places < 2:
        return
    label = yamlfile.anchor(node) or "?"
    own = (
        f"a mapping of its own (`{name}: {{<<: *{label}}}` keeps the shared keys)"
        if isinstance(node, CommentedMap)
        else "a list of its own (a copy)"
    )
    raise ConfigError(
        f"{path}: {name!r} is anchor &{label}, shared by {places} places; tfshards init "
        f"would change all of them: give {name!r} {own}, then run tfshards init again",
        path=path,
    )


def merge_stages(
    document: CommentedMap, wanted: Mapping[str, Any], *, force: bool, path: str
) -> Changes:
    """Add ``wanted`` stages and plots to a loaded dvc.yaml; replace ours only with ``force``."""
    if document.get("stages") is None:  # absent, or `stages:` with nothing under it
        document["stages"] = CommentedMap()
    stages = document["stages"]
    if not isinstance(stages, CommentedMap):
        raise ConfigError(f"{path}: 'stages' must be a mapping, found {type(stages).__name__}")
    changes = Changes()
    for name, stage in wanted.items():
        if name not in stages:
            changes.added.append(name)
        elif plain(stages[name]) == plain(stage):
            changes.unchanged.append(name)
        elif not is_ours(stages[name]):
            raise ConfigError(
                f"{path}: stage {name!r} exists and does not run tfshards "
                f"(cmd: {command(stages[name])!r}); rename it, then run tfshards init again",
                stage=name,
            )
        else:
            changes.replaced.append(name)
    if changes.replaced and not force:
        named = ", ".join(repr(name) for name in changes.replaced)
        one = len(changes.replaced) == 1
        said = f"stage {named} differs" if one else f"stages {named} differ"
        raise ConfigError(
            f"{path}: {said} from what tfshards init writes; pass --force to replace "
            + ("it" if one else "them"),
            stage=changes.replaced[0],
        )
    if changes.added or changes.replaced:
        check_own(document, stages, "stages", path=path)
    for name in changes.added + changes.replaced:
        stages[name] = to_yaml(wanted[name])
    if document.get("plots") is None:
        document["plots"] = CommentedSeq()
    plots = document["plots"]
    if not isinstance(plots, CommentedSeq):
        raise ConfigError(f"{path}: 'plots' must be a list, found {type(plots).__name__}")
    have = {key for entry in plots for key in (entry if isinstance(entry, Mapping) else [entry])}
    missing = [key for key in pipeline.PLOTS if key not in have]
    if missing:
        check_own(document, plots, "plots", path=path)
    for key in missing:
        plots.append(to_yaml({key: pipeline.PLOTS[key]}))
        changes.added.append(f"plots ({key})")
    return changes


def merge_params(
    document: CommentedMap,
    wanted: Mapping[str, Mapping[str, Any]],
    *,
    explicit: Mapping[str, Mapping[str, Any]],
    force: bool,
    path: str,
) -> Changes:
    """Add missing sections and keys to a loaded params.yaml; never change another value.

    ``explicit`` holds the values the user asked for on the command line: one
    that differs from the file's fails without ``force`` and replaces it with.
    ``force`` also brings the comments of tfshards' keys up to date and removes
    the keys an earlier release wrote that no command reads now
    (:data:`~tfshards.project.pipeline.RETIRED_PARAMS`).
    """
    changes = Changes()
    for section, values in wanted.items():
        if document.get(section) is None:
            document[section] = to_yaml(values, pipeline.PARAM_COMMENTS.get(section, {}))
            changes.added.append(section)
            continue
        existing = document[section]
        if not isinstance(existing, CommentedMap):
            raise ConfigError(f"{path}: {section!r} must be a mapping to hold tfshards params")
        updates: dict[str, Any] = {}
        for key, value in values.items():
            name = f"{section}.{key}"
            if key not in existing:
                updates[key] = value
                changes.added.append(name)
            elif key in explicit.get(section, {}) and existing[key] != value:
                if not force:
                    raise ConfigError(
                        f"{path}: {name} is {existing[key]!r}, the command line asks {value!r}; "
                        "pass --force to replace it",
                        param=name,
                    )
                updates[key] = value
                changes.replaced.append(name)
        retired = [k for k in pipeline.RETIRED_PARAMS.get(section, ()) if k in existing]
        foreign = [str(k) for k in existing if k not in values and k not in retired]
        if foreign and updates:
            changes.shared[section] = foreign
        if updates or (force and retired):
            check_own(document, existing, section, path=path)
        comments = pipeline.PARAM_COMMENTS.get(section, {})
        _place(existing, updates, values, comments)
        if force:
            for key in retired:
                del existing[key]
                changes.removed.append(f"{section}.{key}")
            reworded = _refresh_comments(existing, comments)
            changes.reworded += [f"{section}.{key}" for key in reworded]
    return changes


def _refresh_comments(existing: CommentedMap, comments: Mapping[str, str]) -> list[str]:
    """Each tfshards key's comment as this release words it, in the section's column;
    the keys whose comment changed."""
    column, changed = _comment_column(existing), []
    for key, comment in comments.items():
        if key not in existing:
            continue
        tokens = existing.ca.items.get(key)
        token = tokens[2] if tokens and len(tokens) > 2 else None
        if token is None:
            existing.yaml_add_eol_comment(comment, key, column=column)
            changed.append(key)
            continue
        # The token also holds the full-line comments below the key (a user's, above the
        # next key): only its first line is tfshards' comment.
        first, newline, rest = token.value.partition("\n")
        if first.strip().lstrip("#").strip() != comment:
            token.value = f"{first[: first.find('#')]}# {comment}{newline}{rest}"
            changed.append(key)
    return changed


def _place(
    existing: CommentedMap,
    updates: Mapping[str, Any],
    values: Mapping[str, Any],
    comments: Mapping[str, str],
) -> None:
    """Set ``updates`` in ``existing``: a new key where init puts it (after the key before
    it in ``values``), with its comment in the column the section's comments use."""
    order = list(values)
    for key, value in updates.items():
        if key in existing:
            existing[key] = value
            continue
        before = [k for k in order[: order.index(key)] if k in existing]
        at = list(existing).index(before[-1]) + 1 if before else len(existing)
        existing.insert(at, key, value)
        if key in comments:
            existing.yaml_add_eol_comment(comments[key], key, column=_comment_column(existing))


def _comment_column(section: CommentedMap) -> int:
    """The column of the section's first end-of-line comment (init aligns them all)."""
    for tokens in section.ca.items.values():
        token = tokens[2] if len(tokens) > 2 else None
        if token is not None and token.value.lstrip().startswith("#"):
            return int(token.start_mark.column)
    return 4 + max((len(f"{k}: {v}") for k, v in section.items()), default=0)


@dataclass(frozen=True)
class InitResult:
    """What :func:`init` did to each file, and the pipeline it settled on."""

    spec: pipeline.PipelineSpec
    stages: Changes
    params: Changes


def init(directory: Path, explicit: Mapping[str, Any], *, force: bool, version: str) -> InitResult:
    """Write or merge the tfshards pipeline into ``directory``'s dvc.yaml and params.yaml.

    Args:
        directory: the repository folder (git and DVC initialized).
        explicit: :class:`~tfshards.project.pipeline.PipelineSpec` fields the user
            gave; the others come from params.yaml when it has them, else
            the defaults.
        force: replace tfshards stages that differ, and params that differ
            from an explicit value.
        version: the tfshards version the stage commands are pinned to.
    """
    check_repository(directory)
    dvc_path, params_path = directory / "dvc.yaml", directory / "params.yaml"
    params_doc = load(params_path)
    dvc_doc = load(dvc_path)
    settled = dict(explicit)
    for name, (section, key) in pipeline.SPEC_PARAMS.items():
        existing = params_doc.get(section)
        if name not in settled and isinstance(existing, Mapping) and key in existing:
            settled[name] = existing[key]
    try:
        spec = pipeline.PipelineSpec(**settled)
    except TypeError as exc:  # a params.yaml value of the wrong type
        raise ConfigError(f"{params_path}: {exc}") from None
    for url in (spec.root, spec.shards):
        check_backend(url)
    rawdata.check_not_in_git(directory, spec.root)  # before a file is written
    rawdata.check_links(directory, spec.root)
    wanted = pipeline.params(spec)
    asked: dict[str, dict[str, Any]] = {}
    for name in explicit:
        section, key = pipeline.SPEC_PARAMS[name]
        asked.setdefault(section, {})[key] = wanted[section][key]
    param_changes = merge_params(
        params_doc, wanted, explicit=asked, force=force, path=str(params_path)
    )
    stages = pipeline.stages(remote=spec.remote, program=program(version))
    stage_changes = merge_stages(dvc_doc, stages, force=force, path=str(dvc_path))
    writes = [
        (path, document)
        for path, document, changes in (
            (params_path, params_doc, param_changes),
            (dvc_path, dvc_doc, stage_changes),
        )
        if changes.added or changes.replaced or changes.removed or changes.reworded
        # else leave the file's bytes alone
    ]
    for path, _ in writes:
        yamlfile.target(path)  # a file it must not replace fails before either is written
    for path, document in writes:
        save(path, dump(document))
    return InitResult(spec=spec, stages=stage_changes, params=param_changes)
