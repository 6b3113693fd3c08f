"""Round-trip YAML: long commands fold before options, comments survive, bad YAML is one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tfshards.errors import ConfigError
from tfshards.project import pipeline, scaffold, yamlfile


def test_long_commands_fold_before_options_and_keep_their_words():
    cmd = pipeline.stages(remote=False, program=scaffold.program("1.2.3"))["train"]["cmd"]
    text = yamlfile.dump(yamlfile.to_yaml({"cmd": cmd}))
    lines = text.splitlines()[1:]
    assert len(lines) > 2 and all(len(line) <= yamlfile.FOLD_AT + 6 for line in lines)
    assert all(line.strip().startswith("--") for line in lines[1:])
    assert " ".join(yaml.safe_load(text)["cmd"].split()) == " ".join(cmd.split())


def test_a_short_command_stays_on_one_line():
    assert yamlfile.dump(yamlfile.to_yaml({"cmd": "tfshards list raw"})) == (
        "cmd: tfshards list raw\n"
    )


def test_load_then_save_keeps_comments_and_order(tmp_path: Path):
    path = tmp_path / "params.yaml"
    path.write_text("# top\nb: 1  # why b\na:\n  x: 2\n")
    document = yamlfile.load(path)
    document["c"] = yamlfile.to_yaml({"k": 3}, {"k": "what k is"})
    yamlfile.save(path, yamlfile.dump(document))
    text = path.read_text()
    assert text.startswith("# top\nb: 1  # why b\na:\n  x: 2\n")
    assert yaml.safe_load(text) == {"b": 1, "a": {"x": 2}, "c": {"k": 3}}
    assert "# what k is" in text
    assert [p.name for p in tmp_path.iterdir()] == ["params.yaml"]  # no temp file left


def test_a_missing_or_empty_file_is_an_empty_mapping(tmp_path: Path):
    assert yamlfile.load(tmp_path / "none.yaml") == {}
    (tmp_path / "empty.yaml").write_text("")
    assert yamlfile.load(tmp_path / "empty.yaml") == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [("a: [unclosed\n", "not valid YAML"), ("- a\n- b\n", "expected a YAML mapping")],
)
def test_bad_yaml_is_one_line_naming_the_file(tmp_path: Path, text: str, message: str):
    path = tmp_path / "dvc.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        yamlfile.load(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)
