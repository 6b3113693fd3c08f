"""Stage options defined once: the typer commands, DVC commands and params all come from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from ruamel.yaml.comments import CommentedMap
from typer.testing import CliRunner

from tfshards.cli import app
from tfshards.cli.validate import validate_command
from tfshards.cli.write import write_command
from tfshards.listing import listoptions
from tfshards.option import Option
from tfshards.project import pipeline, stageoptions, yamlfile
from tfshards.training import trainconfig
from tfshards.validation import config as validateconfig
from tfshards.writing import config as writeconfig

REPO = Path(__file__).resolve().parents[2]
# The values this repository's params.yaml picks for the digits demo (the rest are defaults).
REPO_SPEC = pipeline.PipelineSpec(extensions=".png", name="digits", image_size=16)
REPO_VALUES = {"write": {"num_shards": 16, "seed": 42}}


def _generated_lines() -> list[str]:
    document = CommentedMap()
    for section, values in pipeline.params(REPO_SPEC).items():
        chosen = {**values, **REPO_VALUES.get(section, {})}
        document[section] = yamlfile.to_yaml(chosen, pipeline.PARAM_COMMENTS.get(section, {}))
    return yamlfile.dump(document).splitlines()


def test_this_repositorys_params_yaml_is_what_init_generates():
    """Keys, order, comments and their column: only the demo's values are its own."""
    text = (REPO / "params.yaml").read_text()
    sections = text.split("\n\n")
    kept = [s for s in sections if not s.startswith(("#", "sample:"))]
    ours = [line for s in kept for line in s.splitlines()]
    assert ours == _generated_lines()


@pytest.mark.parametrize("options", [writeconfig.OPTIONS, validateconfig.OPTIONS])
def test_every_option_is_a_command_line_option_with_its_help(options: tuple[Option, ...]):
    command = write_command if options is writeconfig.OPTIONS else validate_command
    info = typer.main.get_command_from_info(
        typer.models.CommandInfo(callback=command),
        pretty_exceptions_short=True,
        rich_markup_mode=None,
    )
    by_name = {p.name: p for p in info.params}
    for option in options:
        assert by_name[option.name].help == option.help


def test_each_stage_says_what_its_executor_auto_means():
    helps = [
        {o.name: o.help for o in options}["executor"]
        for options in (writeconfig.OPTIONS, validateconfig.OPTIONS)
    ]
    assert "threads when the per-record loop runs in the compiled" in helps[0]
    assert "auto: processes" in helps[1] and helps[0] != helps[1]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("true", True), ("True", True), ("TRUE", True), ("yes", True), ("1", True), ("on", True),
     ("false", False), ("False", False), ("no", False), ("0", False), (" off ", False)],
)  # fmt: skip
def test_dvc_booleans_parse_one_way(text: str, expected: bool):
    assert stageoptions.parse_bool(text, "--x") is expected


@pytest.mark.parametrize(
    ("text", "expected"), [("None", None), ("null", None), ("", None), ("7", 7)]
)
def test_dvc_optional_integers_parse_one_way(text: str, expected: int | None):
    assert stageoptions.optional_int(text, "--x") == expected


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_validate_refuses_a_boolean_it_cannot_read(value: str):
    said = CliRunner().invoke(app, ["validate", "m.json", "--fail-on-leakage", value])
    assert said.exit_code == 2


def test_a_config_takes_the_run_options_as_one_field_or_as_keywords():
    config = writeconfig.WriteConfig(out="x", workers=3, executor="serial")
    assert (config.run.workers, config.run.executor) == (3, "serial")
    assert validateconfig.ValidateConfig("m.json", dask_address="tcp://h:1").run.address == (
        "tcp://h:1"
    )


def test_values_become_the_config_fields_they_name():
    values: dict[str, Any] = {o.name: o.default for o in writeconfig.OPTIONS}
    values.update(listing="l", num_shards=0, target_shard_mb=1, resize=32, workers=2)
    config = stageoptions.config(writeconfig.WriteConfig, writeconfig.OPTIONS, values)
    assert config.num_shards is None and config.target_shard_bytes == 1 << 20
    assert config.resize == 32 and config.run.workers == 2
    assert config.manifest_copy == "data/manifest.json"


def test_train_params_and_command_come_from_its_options():
    cmd = pipeline.stages(remote=False, program=lambda s: s)["train"]["cmd"]
    for option in trainconfig.OPTIONS:
        if option.param is True and option.name != "model_args":
            assert f"--{option.name.replace('_', '-')} ${{train.{option.name}}}" in cmd
    assert cmd.endswith(" -- ${train.model_args}")


@pytest.mark.parametrize(
    ("command", "section", "key", "hint"),
    [
        (["train", "--manifest", "m.json"], "train", "epoch", "; did you mean epoch -> epochs?"),
        (
            ["validate", "m.json"],
            "validate",
            "fail_on_leakge",
            "; did you mean fail_on_leakge -> fail_on_leakage?",
        ),
        (["list", "raw", "--out", "listing"], "list", "zebra", ""),
    ],
)
def test_a_params_key_no_option_reads_is_a_warning_line(
    tmp_path, monkeypatch, command, section, key, hint
):
    monkeypatch.chdir(tmp_path)
    known = {"train": "epochs", "validate": "decode", "list": "root"}[section]
    Path("params.yaml").write_text(f"{section}:\n  {key}: 3\n  {known}: 1\n")
    said = CliRunner().invoke(app, command)
    first = said.stderr.strip().splitlines()[0]
    assert first == (
        f"warning: params.yaml: {section}.{key} is no option of `tfshards {section}`, so no "
        f"command reads it{hint}"
    )


def test_every_option_of_a_command_is_a_known_key(tmp_path, monkeypatch):
    """write takes its whole section (`${write}`): workers, executor, transform are options."""
    monkeypatch.chdir(tmp_path)
    Path("params.yaml").write_text("write:\n  workers: 1\n  executor: serial\n")
    assert stageoptions.stray_param("write", writeconfig.OPTIONS) is None


def test_the_demo_params_pass_the_check(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("params.yaml").write_text((Path(__file__).parents[2] / "params.yaml").read_text())
    for section, options in (
        ("list", listoptions.OPTIONS),
        ("train", trainconfig.OPTIONS),
        ("validate", validateconfig.OPTIONS),
        ("write", writeconfig.OPTIONS),
    ):
        assert stageoptions.stray_param(section, options) is None


def test_every_stray_key_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("params.yaml").write_text("train:\n  epoch: 3\n  lerning_rate: 0.1\n  zebra: 1\n")
    assert stageoptions.stray_param("train", trainconfig.OPTIONS) == (
        "params.yaml: train.epoch, train.lerning_rate, train.zebra are no options of "
        "`tfshards train`, so no command reads them; did you mean epoch -> epochs, "
        "lerning_rate -> learning_rate?"
    )


def test_keys_are_read_as_written_and_a_merge_stands_for_its_keys(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("params.yaml").write_text(
        "base: &base {epochs: 2, on: 1}\ntrain:\n  <<: *base\n  yes: 3\n  seed: 1\n"
    )
    assert stageoptions.stray_param("train", trainconfig.OPTIONS) == (
        "params.yaml: train.on, train.yes are no options of `tfshards train`, so no command "
        "reads them"
    )


@pytest.mark.parametrize(
    "text",
    [
        b"train:\n  epochs: \xff\xfe\n",  # not UTF-8
        b"train: [unclosed\n",  # not YAML
        b"train:\n" + b"  - " * 1 + b"[" * 3_000 + b"]" * 3_000 + b"\n",  # too deep
        b"- a\n- b\n",  # not a mapping
    ],
)
def test_a_params_file_dvc_cannot_read_gives_no_warning_and_no_error(tmp_path, monkeypatch, text):
    monkeypatch.chdir(tmp_path)
    Path("params.yaml").write_bytes(text)
    assert stageoptions.stray_param("train", trainconfig.OPTIONS) is None


def test_aliases_are_not_expanded(tmp_path, monkeypatch):
    # 30 levels of ten aliases each: 10**30 leaves if a reader expanded them.
    monkeypatch.chdir(tmp_path)
    lines = ["a0: &a0 [" + ", ".join(["x"] * 10) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 30)]
    Path("params.yaml").write_text("\n".join(lines) + "\ntrain:\n  epochs: *a29\n  zebra: 1\n")
    said = stageoptions.stray_param("train", trainconfig.OPTIONS)
    assert said is not None and said.startswith("params.yaml: train.zebra is no option")
