"""`tfshards init`: the stages it writes, how it merges, and this repository's agreement."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_yamlfile import billion_laughs
from typer.testing import CliRunner

from tfshards import __version__
from tfshards.cli import app
from tfshards.project import ignores, pipeline, scaffold, yamlfile

REPO = Path(__file__).resolve().parents[2]
CODE_DEPS = ("stages/", "src/tfshards/")  # deps this repository adds: its own source files


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder that looks like `git init && dvc init` ran in it."""
    (tmp_path / ".git").mkdir()
    (tmp_path / ".dvc").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _init(*args: str) -> Any:
    return CliRunner().invoke(app, ["init", *args])


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


# --- this repository's dvc.yaml and params.yaml are what init writes --------------


def _program_args(name: str, cmd: str) -> list[str]:
    """The command's arguments after its program (``python stages/x.py`` or ``tfshards … x``)."""
    words = cmd.split()
    if words[0] == "python":
        return words[2:]
    return words[words.index(name) + 1 :]


def _stage_differences(name: str, ours: dict[str, Any], inits: dict[str, Any]) -> list[str]:
    found = []
    mine, theirs = _program_args(name, ours["cmd"]), _program_args(name, inits["cmd"])
    if mine != theirs:
        only_mine = [w for w in mine if w not in theirs]
        only_init = [w for w in theirs if w not in mine]
        detail = (
            f"only in dvc.yaml: {only_mine}; only in init's: {only_init}"
            if only_mine or only_init
            else f"same words, another order: dvc.yaml {mine}, init {theirs}"
        )
        found.append(f"stage {name}: cmd arguments differ ({detail})")
    data_deps = [d for d in ours.get("deps", []) if not str(d).startswith(CODE_DEPS)]
    if data_deps != inits.get("deps", []):
        found.append(
            f"stage {name}: non-code deps: dvc.yaml {data_deps}, init {inits.get('deps', [])}"
        )
    for key in ("params", "outs", "metrics", "plots", "wdir", "frozen"):
        if ours.get(key) != inits.get(key):
            found.append(f"stage {name}: {key}: dvc.yaml {ours.get(key)}, init {inits.get(key)}")
    return found


def test_this_repositorys_stages_are_what_init_writes_plus_sample():
    ours = _load(REPO / "dvc.yaml")
    inits = yamlfile.plain(
        yamlfile.to_yaml(
            pipeline.stages(remote=False, program=scaffold.program(__version__)),
        )
    )
    names = [n for n in ours["stages"] if n != "sample"]
    assert names == list(inits), f"stage names: dvc.yaml {names}, init {list(inits)}"
    problems = []
    for name in names:
        problems += _stage_differences(name, ours["stages"][name], inits[name])
    wanted_plots = [{k: v} for k, v in pipeline.PLOTS.items()]
    if ours.get("plots") != wanted_plots:
        problems.append(f"top-level plots: dvc.yaml {ours.get('plots')}, init {wanted_plots}")
    assert not problems, "dvc.yaml and `tfshards init` disagree:\n" + "\n".join(problems)


def test_every_stage_script_runs_the_matching_tfshards_command():
    ours = _load(REPO / "dvc.yaml")["stages"]
    for name in pipeline.STAGES:
        script = re.match(r"python (stages/\S+\.py)", ours[name]["cmd"])
        assert script, f"stage {name}: cmd does not run a stages/*.py script"
        source = (REPO / script[1]).read_text()
        command = {"list": "list_files_command"}.get(name, f"{name}_command")
        imported = re.search(rf"from tfshards\.cli\.{name} import ([\w, ]+)", source)
        assert imported and command in imported[1].split(", "), f"{script[1]} runs {command}?"


def test_this_repositorys_params_have_the_keys_init_writes():
    ours = _load(REPO / "params.yaml")
    problems = []
    for section, values in pipeline.params(pipeline.PipelineSpec()).items():
        have = list(ours.get(section, {}))
        if have != list(values):
            missing = [k for k in values if k not in have]
            extra = [k for k in have if k not in values]
            problems.append(
                f"params.yaml section {section}: missing {missing}, not written by init {extra}"
                + ("" if missing or extra else f" (order: {have} vs {list(values)})")
            )
    assert not problems, "params.yaml and `tfshards init` disagree:\n" + "\n".join(problems)


# --- the stages --------------------------------------------------------------------


def test_local_shards_are_a_persisted_out_that_validate_and_train_depend_on():
    stages = pipeline.stages(remote=False, program=lambda s: f"tfshards {s}")
    assert {"${write.out}": {"persist": True}} in stages["write"]["outs"]
    assert "${write.out}" in stages["validate"]["deps"]
    assert "${write.out}" in stages["train"]["deps"]


def test_remote_shards_leave_only_the_manifest_and_metrics_to_dvc():
    stages = pipeline.stages(remote=True, program=lambda s: f"tfshards {s}")
    assert stages["write"]["outs"] == [{pipeline.MANIFEST: {"persist": True}}]
    for name in ("validate", "train"):
        assert not any("write.out" in str(dep) for dep in stages[name]["deps"])
    assert pipeline.VALIDATE_METRICS in stages["train"]["deps"]  # train runs after validate


@pytest.mark.parametrize(
    ("url", "remote"),
    [("data/shards", False), ("/abs/shards", False), ("file:///x", False), ("s3://b/p", True),
     ("gs://b/p", True), ("memory://p", True)],
)  # fmt: skip
def test_remote_means_a_non_local_protocol(url, remote):
    assert pipeline.is_remote(url) is remote


def test_every_train_option_in_the_command_is_a_train_cli_option():
    from tfshards.cli.train import train_command

    declared = {f"--{p.replace('_', '-')}" for p in train_command.__annotations__}
    cmd = pipeline.stages(remote=False, program=lambda s: s)["train"]["cmd"]
    used = set(re.findall(r"--[a-z-]+", cmd))
    assert used <= declared, f"not options of tfshards train: {sorted(used - declared)}"


def test_every_write_param_is_a_write_option_as_dvc_unpacks_it():
    from tfshards.cli.write import write_command

    cmd = pipeline.stages(remote=False, program=lambda s: s)["write"]["cmd"]
    assert cmd.endswith(" ${write}")  # DVC's dict unpacking: `--key 'value'` per key
    declared = set(write_command.__annotations__)
    keys = set(pipeline.params(pipeline.PipelineSpec())["write"])
    assert keys <= declared, f"write params that are no write option: {sorted(keys - declared)}"


def test_write_reads_options_spelled_as_params_keys(tmp_path: Path):
    (tmp_path / "listing").mkdir()
    args = ["write", str(tmp_path / "listing"), "--num_shards", "oops", "--group_by", "x"]
    said = subprocess.run(
        [sys.executable, "-m", "tfshards", *args], capture_output=True, text=True, timeout=120
    )
    assert said.returncode == 2  # --num_shards was taken as --num-shards, then its value refused
    assert said.stderr.startswith("error: Invalid value for '--num-shards': ")
    assert "'oops' is not a valid int" in said.stderr and said.stderr.count("\n") == 1


def test_a_bad_name_is_refused_naming_the_option():
    with pytest.raises(ValueError, match="name must be a plain file prefix"):
        pipeline.PipelineSpec(name="a/b")


# --- init in a repository -----------------------------------------------------------


def test_init_writes_the_stages_pinned_to_this_version_and_the_params(repo):
    result = _init("--root", "images", "--image-size", "32")
    assert result.exit_code == 0, result.output
    stages = _load(repo / "dvc.yaml")["stages"]
    assert list(stages) == list(pipeline.STAGES)
    for name, stage in stages.items():
        assert stage["cmd"].startswith(f"tfshards --pipeline-version {__version__} {name} ")
    params = _load(repo / "params.yaml")
    assert params["list"]["root"] == "images" and params["train"]["image_size"] == 32
    assert params["write"]["out"] == "data/shards"
    assert "added stages list, write, validate, train" in result.output


def test_init_without_the_images_yet_says_to_dvc_add_them_before_the_first_repro(repo):
    """It ended "Next: dvc repro", and a repro then ran with the images in neither git
    (ignored) nor DVC."""
    result = _init("--root", "images")
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert any(line.startswith("note: images does not exist yet: ") for line in lines)
    assert lines[-1].endswith("Next: put the images in, dvc add images, then dvc repro")


def test_init_keeps_other_stages_params_and_comments(repo):
    (repo / "dvc.yaml").write_text(
        "stages:\n  prepare:  # fetch the photos\n    cmd: python prepare.py\n"
        "    outs:\n      - data/raw\n"
    )
    (repo / "params.yaml").write_text("prepare:\n  url: https://example.com  # mirror\n")
    assert _init().exit_code == 0
    dvc_text, params_text = (repo / "dvc.yaml").read_text(), (repo / "params.yaml").read_text()
    assert "# fetch the photos" in dvc_text and "# mirror" in params_text
    assert list(_load(repo / "dvc.yaml")["stages"]) == ["prepare", *pipeline.STAGES]
    assert _load(repo / "params.yaml")["prepare"] == {"url": "https://example.com"}


def test_init_again_changes_no_byte(repo):
    assert _init("--shards", "s3://bucket/shards").exit_code == 0
    before = {p: (repo / p).read_bytes() for p in ("dvc.yaml", "params.yaml")}
    result = _init()
    assert result.exit_code == 0, result.output
    assert "kept stages list, write, validate, train" in result.output
    assert {p: (repo / p).read_bytes() for p in before} == before


def test_init_keeps_params_the_user_tuned_and_adds_missing_keys(repo):
    assert _init().exit_code == 0
    params = (repo / "params.yaml").read_text()
    params = params.replace("epochs: 10", "epochs: 3").replace("  seed: 0  ", "  SEED_GONE: 0  ", 1)
    (repo / "params.yaml").write_text(params)
    result = _init()
    assert result.exit_code == 0, result.output
    values = _load(repo / "params.yaml")
    assert values["train"]["epochs"] == 3 and values["write"]["seed"] == 0
    assert "added params write.seed" in result.output


def test_force_after_an_upgrade_places_new_keys_refreshes_comments_and_drops_retired_ones(repo):
    """A params.yaml an earlier release wrote: write.near_duplicates (now validate's), its
    old comment on near_duplicate_distance, validate.near_duplicates missing."""
    assert _init().exit_code == 0
    text = (repo / "params.yaml").read_text()
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  old_versions:"))
    lines.insert(at, "  near_duplicates: true  # true: store perceptual hashes")
    lines = [line for line in lines if not line.startswith("  near_duplicates: false")]
    old = [
        line.split("#")[0] + "# bits of 64 (write.near_duplicates)"
        if line.startswith("  near_duplicate_distance:")
        else line
        for line in lines
    ]
    (repo / "params.yaml").write_text("\n".join(old) + "\n")
    plain = _init()  # without --force: the missing key only
    assert plain.exit_code == 0, plain.output
    assert _load(repo / "params.yaml")["write"]["near_duplicates"] is True
    result = _init("--force")
    assert result.exit_code == 0, result.output
    assert "removed params write.near_duplicates" in result.output
    assert (repo / "params.yaml").read_text() == text  # as a fresh init writes it


def test_force_keeps_the_users_full_line_comments(repo):
    """ruamel keeps a comment line below a key in that key's comment: refreshing tfshards'
    comment must leave those lines (a user's notes above the next key) alone."""
    assert _init().exit_code == 0
    text = (repo / "params.yaml").read_text()
    text = text.replace("validate:\n", "# above validate\nvalidate:\n", 1)
    text = text.replace("  num_shards: 0 ", "  # my note on num_shards\n  num_shards: 0 ", 1)
    text += "# above myproj\nmyproj:\n  lr_note: hi  # keep me\n"
    (repo / "params.yaml").write_text(text)
    result = _init("--force")
    assert result.exit_code == 0, result.output
    assert (repo / "params.yaml").read_text() == text
    assert "updated the comment" not in result.output


def test_init_reads_the_shard_location_back_from_params(repo):
    assert _init("--shards", "memory://bucket/shards").exit_code == 0
    (repo / "dvc.yaml").unlink()
    assert _init().exit_code == 0  # no --shards: params.yaml says memory://
    assert _load(repo / "dvc.yaml")["stages"]["write"]["outs"] == [
        {pipeline.MANIFEST: {"persist": True}}
    ]


def test_an_option_that_contradicts_params_needs_force(repo):
    assert _init().exit_code == 0
    before = (repo / "params.yaml").read_bytes()
    refused = _init("--shards", "s3://bucket/shards")
    assert refused.exit_code == 1
    assert "write.out is 'data/shards', the command line asks 's3://bucket/shards'" in (
        refused.output
    )
    assert (repo / "params.yaml").read_bytes() == before
    forced = _init("--shards", "s3://bucket/shards", "--force")
    assert forced.exit_code == 0, forced.output
    assert _load(repo / "params.yaml")["write"]["out"] == "s3://bucket/shards"
    assert _load(repo / "dvc.yaml")["stages"]["write"]["outs"] == [
        {pipeline.MANIFEST: {"persist": True}}
    ]
    assert "replaced stages write, validate, train" in forced.output


def test_a_changed_tfshards_stage_is_replaced_only_with_force(repo):
    assert _init().exit_code == 0
    text = (repo / "dvc.yaml").read_text().replace(f"--pipeline-version {__version__}", "--x")
    (repo / "dvc.yaml").write_text(text)  # as if written by another tfshards version
    refused = _init()
    assert refused.exit_code == 1, refused.output
    assert refused.output.splitlines()[-1].endswith(  # every stage that differs, at once
        "dvc.yaml: stages 'list', 'write', 'validate', 'train' differ from what tfshards init "
        "writes; pass --force to replace them"
    )
    assert (repo / "dvc.yaml").read_text() == text
    assert _init("--force").exit_code == 0
    assert f"--pipeline-version {__version__}" in (repo / "dvc.yaml").read_text()


def test_an_upgrade_that_adds_old_versions_remove_says_what_it_will_delete(repo):
    """An older params.yaml without write.old_versions: init adds `remove`, and its next
    write deletes versions; that was one word in the list of added params."""
    assert _init().exit_code == 0
    text = (repo / "params.yaml").read_text()
    lines = [line for line in text.splitlines() if not line.startswith("  old_versions:")]
    (repo / "params.yaml").write_text("\n".join(lines) + "\n")
    result = _init()
    assert result.exit_code == 0, result.output
    assert "params.yaml: added params write.old_versions" in result.output
    assert (
        "note: write.old_versions: remove: from the next write on, the other versions under "
        "data/shards that DVC's cache holds are deleted"
    ) in result.output
    assert "note: write.old_versions" not in _init().output  # said once, when added


def test_a_users_stage_with_a_tfshards_name_is_never_replaced(repo):
    mine = "stages:\n  train:\n    cmd: python my_train.py\n"
    (repo / "dvc.yaml").write_text(mine)
    result = _init("--force")
    assert result.exit_code == 1
    assert "stage 'train' exists and does not run tfshards" in result.output
    assert (repo / "dvc.yaml").read_text() == mine
    assert not (repo / "params.yaml").exists()  # nothing written when a check fails


@pytest.mark.parametrize(("missing", "step"), [(".git", "git init"), (".dvc", "dvc init")])
def test_init_outside_a_git_and_dvc_repository_names_the_missing_step(repo, missing, step):
    (repo / missing).rmdir()
    result = _init()
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and f"run `{step}` first" in result.output
    assert not (repo / "dvc.yaml").exists()


def test_broken_yaml_is_one_line_naming_the_file(repo):
    (repo / "dvc.yaml").write_text("stages: [unclosed\n")
    result = _init()
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert "dvc.yaml: not valid YAML" in result.output


def test_a_stage_pinned_to_another_version_stops_naming_both(repo):
    result = CliRunner().invoke(app, ["--pipeline-version", "0.0.1", "list", "--help"])
    assert result.exit_code == 1
    assert f"written for tfshards 0.0.1, this is tfshards {__version__}" in result.output


def test_tfshards_init_help_in_a_real_process():
    result = subprocess.run(
        [sys.executable, "-m", "tfshards", "init", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and "--shards" in result.stdout


def test_an_empty_dvc_yaml_and_params_yaml_are_filled(repo):
    (repo / "dvc.yaml").write_text("stages:\nplots:\n")
    (repo / "params.yaml").write_text("# tuned by hand\nwrite:\n")
    result = _init()
    assert result.exit_code == 0, result.output
    assert list(_load(repo / "dvc.yaml")["stages"]) == list(pipeline.STAGES)
    assert _load(repo / "params.yaml")["write"]["out"] == "data/shards"
    assert "# tuned by hand" in (repo / "params.yaml").read_text()


def test_a_shard_url_without_its_filesystem_installed_is_refused(repo):
    result = _init("--shards", "nosuchfs://bucket/shards")
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert "nosuchfs://bucket/shards: no filesystem for nosuchfs://" in result.output
    assert not (repo / "dvc.yaml").exists()


# --- what init must not change ------------------------------------------------------


def _refused(repo: Path, name: str, content: bytes, *args: str) -> str:
    """Plant ``content`` as ``name``, run init, check it failed in one line and wrote nothing."""
    (repo / name).write_bytes(content)
    result = _init(*args)
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert (repo / name).read_bytes() == content
    assert not (repo / ("params.yaml" if name == "dvc.yaml" else "dvc.yaml")).exists()
    return str(result.output)


def test_a_section_shared_through_an_anchor_is_refused_saying_how_to_split_it(repo):
    output = _refused(repo, "params.yaml", b"base: &base\n  lr: 1\ntrain: *base\nother: *base\n")
    assert "'train' is anchor &base, shared by 3 places" in output
    assert "`train: {<<: *base}` keeps the shared keys" in output


def test_stages_shared_through_an_anchor_are_refused(repo):
    shared = b"common: &s\n  prepare:\n    cmd: python prepare.py\nstages: *s\n"
    assert "'stages' is anchor &s, shared by 2 places" in _refused(repo, "dvc.yaml", shared)


def test_a_section_that_merges_an_anchor_gets_the_keys_and_the_anchor_stays(repo):
    (repo / "params.yaml").write_text("base: &base\n  lr: 1\ntrain:\n  <<: *base\n")
    assert _init().exit_code == 0
    text = (repo / "params.yaml").read_text()
    assert text.startswith("base: &base\n  lr: 1\ntrain:\n  <<: *base\n  model: ")
    values = _load(repo / "params.yaml")
    assert values["base"] == {"lr": 1} and values["train"]["lr"] == 1


@pytest.mark.parametrize("name", ["params.yaml", "dvc.yaml"])
def test_a_recursive_alias_is_refused_not_written_back_as_null(repo, name):
    output = _refused(repo, name, b"prepare: &p\n  x: 1\n  self: *p\n")
    assert f"{name}: anchor &p contains an alias of itself" in output


def test_a_latin1_params_file_is_one_line_naming_the_offset(repo):
    output = _refused(repo, "params.yaml", "prepare:\n  name: café\n".encode("latin-1"))
    assert "params.yaml: expected UTF-8 text, found byte 0xe9 at offset 20 (line 2)" in output


def test_a_symlinked_params_file_is_written_through_and_stays_a_link(repo):
    (repo / "conf").mkdir()
    (repo / "conf/params.yaml").write_text("prepare:\n  x: 1\n")
    (repo / "params.yaml").symlink_to("conf/params.yaml")
    assert _init().exit_code == 0
    assert os.readlink(repo / "params.yaml") == "conf/params.yaml"
    assert _load(repo / "conf/params.yaml")["write"]["out"] == "data/shards"


def test_init_keeps_the_permission_bits_of_the_files_it_rewrites(repo):
    for name, mode in (("params.yaml", 0o600), ("dvc.yaml", 0o664)):
        (repo / name).write_text("{}\n")
        (repo / name).chmod(mode)
    assert _init().exit_code == 0
    assert stat.S_IMODE((repo / "params.yaml").stat().st_mode) == 0o600
    assert stat.S_IMODE((repo / "dvc.yaml").stat().st_mode) == 0o664
    assert "write" in _load(repo / "params.yaml")


def test_a_hard_linked_params_file_is_refused_before_anything_is_written(repo):
    (repo / "shared.yaml").write_text("prepare:\n  x: 1\n")
    os.link(repo / "shared.yaml", repo / "params.yaml")
    output = _refused(repo, "params.yaml", b"prepare:\n  x: 1\n")
    assert "expected 1 link to the file, found 2 (hard links)" in output


MEASURED_INIT = """
import resource, subprocess, sys, time

def cap():  # a runaway expansion fails at 2 GiB instead of taking the machine's memory
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

started = time.perf_counter()
try:
    done = subprocess.run(
        [sys.executable, "-m", "tfshards", "init"],
        capture_output=True, text=True, timeout=30, preexec_fn=cap,
    )
    code, stderr = done.returncode, done.stderr
except subprocess.TimeoutExpired:  # the child is killed
    code, stderr = "timeout", ""
peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(code, round(time.perf_counter() - started, 1), round(peak_mb))
print(stderr, end="")
"""


def test_an_alias_bomb_is_refused_in_one_line_in_bounded_time_and_memory(repo):
    (repo / "params.yaml").write_text(billion_laughs() + "list:\n  root: *a9\n")
    done = subprocess.run(
        [sys.executable, "-c", MEASURED_INIT],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=60,  # unbounded before: 6.5 GB after 9 minutes, still running
    )
    measured, *lines = done.stdout.splitlines()
    code, seconds, peak_mb = measured.split()
    assert code == "1" and len(lines) == 1, done.stdout + done.stderr
    assert "params.yaml: aliases expand its 33 nodes to 8335593970 " in lines[0]
    assert float(seconds) < 20 and int(peak_mb) < 200, (seconds, peak_mb)
    assert not (repo / "dvc.yaml").exists()


# --- raw data and checkpoints stay out of git -----------------------------------------


def test_the_gitignore_block_is_the_only_part_init_rewrites():
    user = "*.pyc\n# my notes\n/build/\n"
    once = ignores.merge(user, ignores.wanted("data/raw"))
    assert once.startswith(user)
    assert once.endswith(
        f"\n{ignores.BEGIN}\n/data/raw/\n/checkpoints/\n/dvc_plots/\n{ignores.END}\n"
    )
    assert ignores.merge(once, ignores.wanted("data/raw")) == once
    moved = ignores.merge(once + "/dist/\n", ignores.wanted("photos"))
    assert "/photos/\n" in moved and "/data/raw/" not in moved and moved.endswith("/dist/\n")
    assert ignores.wanted("s3://bucket/raw") == ["/checkpoints/", "/dvc_plots/"]  # not inside
    assert ignores.wanted("../elsewhere") == ["/checkpoints/", "/dvc_plots/"]
    outs = ["data/listing/", "data/manifest.json", "s3://bucket/shards/"]
    assert ignores.wanted("data/raw", outs) == [
        "/data/raw/", "/data/listing/", "/data/manifest.json", "/checkpoints/", "/dvc_plots/"
    ]  # fmt: skip


def test_init_with_no_raw_folder_yet_says_to_dvc_add_it(repo):
    result = _init()
    assert result.exit_code == 0, result.output
    assert "then `dvc add data/raw` before `dvc repro`" in result.output
    assert "/data/raw/" in (repo / ".gitignore").read_text()


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return done.stdout


@pytest.fixture
def real_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real `git init` + `dvc init` repository with 6 PNGs in data/raw."""
    from PIL import Image

    _git(tmp_path, "init", "--quiet")
    subprocess.run([sys.executable, "-m", "dvc", "init", "--quiet"], cwd=tmp_path, check=True)
    for label in ("circle", "square"):
        (tmp_path / "data/raw" / label).mkdir(parents=True)
        for i in range(3):
            Image.new("L", (4, 4), 30 * i).save(tmp_path / "data/raw" / label / f"{i}.png")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.slow
def test_init_puts_raw_images_under_dvc_and_keeps_checkpoints_out_of_git(real_repo):
    result = _init()
    assert result.exit_code == 0, result.output
    assert "dvc add data/raw: raw files tracked by DVC" in result.output
    assert (real_repo / "data/raw.dvc").exists()
    (real_repo / "checkpoints/train").mkdir(parents=True)  # what a killed run leaves
    (real_repo / "checkpoints/train/state.json").write_text("{}")
    # What a first `dvc repro` that stopped at write leaves: the listing, which DVC had not
    # yet ignored; committed, it made every later `dvc repro` fail.
    (real_repo / "data/listing").mkdir()
    (real_repo / "data/listing/files.jsonl").write_text("{}\n")
    _git(real_repo, "add", "-A")
    tracked = _git(real_repo, "ls-files").split()
    assert "data/raw.dvc" in tracked and ".gitignore" in tracked
    outs = ("data/raw/", "checkpoints/", "data/listing/")
    assert not [p for p in tracked if p.startswith(outs)], tracked
    assert _init().exit_code == 0  # again: raw.dvc exists, nothing more to add


@pytest.mark.slow
def test_init_says_how_when_git_already_tracks_the_images_and_writes_nothing(real_repo):
    """Found before a file is written: `dvc add` failing after dvc.yaml, params.yaml and
    .gitignore were written left a half set-up repository."""
    _git(real_repo, "add", "data/raw")
    before = sorted(p.name for p in real_repo.iterdir())
    result = _init()
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: data/raw: git tracks 6 files there (data/raw/")
    assert line.endswith("run `git rm -r --cached data/raw`, then `tfshards init` again")
    assert sorted(p.name for p in real_repo.iterdir()) == before


def test_init_says_so_when_it_adds_its_params_to_a_section_of_the_users(repo):
    (repo / "params.yaml").write_text("train:\n  lr: 0.1\n  epochs: 5\n")
    result = _init()
    assert result.exit_code == 0, result.output
    assert (
        "warning: params.yaml: section 'train' also holds keys tfshards does not use (lr): "
        "tfshards' train stage now reads its params there"
    ) in result.stderr
    assert _load(repo / "params.yaml")["train"]["epochs"] == 5  # the user's value stays


def test_init_refuses_links_dvc_add_would_replace_and_writes_nothing(repo, tmp_path_factory):
    """`dvc add data/raw` stores a link's target and puts a file in its place: a user's
    link became a copy; a linked data/raw made `dvc add` fail after init wrote its files."""
    outside = tmp_path_factory.mktemp("outside")
    (outside / "a.png").write_bytes(b"png")
    (repo / "data/raw/cat").mkdir(parents=True)
    (repo / "data/raw/cat/real.png").write_bytes(b"png")
    (repo / "data/raw/cat/linked.png").symlink_to(outside / "a.png")
    before = sorted(p.name for p in repo.iterdir())
    result = _init()
    assert result.exit_code == 1
    assert result.output == (
        "error: data/raw/cat/linked.png: a symbolic link; `dvc add data/raw` would store its "
        "target's bytes and put a file in its place: replace the links in data/raw with "
        "their files (`cp -L`), or `dvc add data/raw` yourself and run `tfshards init` again\n"
    )
    assert (repo / "data/raw/cat/linked.png").is_symlink()
    assert sorted(p.name for p in repo.iterdir()) == before

    shutil.rmtree(repo / "data/raw")
    (repo / "data/raw").symlink_to(outside)  # raw images kept on another disk
    result = _init()
    assert result.exit_code == 1
    assert result.output == (
        f"error: data/raw: a link to {outside}; DVC tracks no folder behind a link (`dvc add` "
        f"refuses it): run `tfshards init --root {outside}` to list the images where they "
        "are, or move them into data/raw\n"
    )
    assert sorted(p.name for p in repo.iterdir()) == before
    assert _init("--root", str(outside)).exit_code == 0  # as it says
