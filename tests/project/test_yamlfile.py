"""Round-trip YAML: long commands fold before options, comments survive, bad YAML is one line."""

from __future__ import annotations

import os
import stat
import threading
import time
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


# --- what load refuses, and what save keeps ---------------------------------------


def billion_laughs(levels: int = 10) -> str:
    """A "billion laughs": 550 bytes whose aliases expand to 9**levels scalars."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _refusal(path: Path, content: bytes) -> str:
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        yamlfile.load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    return message


def test_a_latin1_file_is_refused_naming_the_byte_and_its_offset(tmp_path: Path):
    message = _refusal(tmp_path / "params.yaml", "prepare:\n  name: café\n".encode("latin-1"))
    assert "expected UTF-8 text, found byte 0xe9 at offset 20 (line 2)" in message


def test_a_recursive_alias_is_refused_not_loaded_as_null(tmp_path: Path):
    message = _refusal(tmp_path / "params.yaml", b"prepare: &p\n  x: 1\n  self: *p\n")
    assert "anchor &p contains an alias of itself" in message


def test_an_alias_bomb_is_refused_without_expanding_it(tmp_path: Path):
    started = time.perf_counter()
    message = _refusal(tmp_path / "params.yaml", billion_laughs().encode())
    assert "aliases expand its 30 nodes to 4412961516" in message
    assert time.perf_counter() - started < 2


def test_aliases_that_expand_a_little_are_kept(tmp_path: Path):
    path = tmp_path / "params.yaml"
    path.write_text(billion_laughs(levels=3) + "b: &b {k: 1}\nc: *b\n")
    document = yamlfile.load(path)
    assert document["c"] is document["b"] and len(document["a2"][0]) == 9


def test_nesting_deeper_than_the_parser_follows_is_one_line(tmp_path: Path):
    message = _refusal(tmp_path / "dvc.yaml", b"a: " + b"[" * 400 + b"]" * 400 + b"\n")
    assert "nested too deeply for the YAML parser" in message


def test_a_fifo_is_refused_instead_of_waited_on(tmp_path: Path):
    fifo = tmp_path / "params.yaml"
    os.mkfifo(fifo)
    errors: list[str] = []

    def load() -> None:
        try:
            yamlfile.load(fifo)
        except ConfigError as exc:
            errors.append(str(exc))

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # blocked opening it: a writer that closes at once ends the wait
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
    assert errors == [f"{fifo}: expected a regular file, found a FIFO"]


def test_save_keeps_the_mode_and_writes_through_a_symlink(tmp_path: Path):
    (tmp_path / "conf").mkdir()
    real, link = tmp_path / "conf" / "params.yaml", tmp_path / "params.yaml"
    real.write_text("a: 1\n")
    real.chmod(0o600)
    link.symlink_to("conf/params.yaml")
    yamlfile.save(link, "a: 2\n")
    assert link.is_symlink() and os.readlink(link) == "conf/params.yaml"
    assert real.read_text() == "a: 2\n" and stat.S_IMODE(real.stat().st_mode) == 0o600
    assert sorted(p.name for p in (tmp_path / "conf").iterdir()) == ["params.yaml"]


def test_save_fsyncs_the_file_before_the_rename_and_the_folder_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    path = tmp_path / "params.yaml"
    path.write_text("a: 1\n")
    synced: list[tuple[str, str]] = []  # (what was fsynced, what params.yaml held then)
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), path.read_text()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    yamlfile.save(path, "a: 2\n")
    assert [(Path(p).name.startswith(".params.yaml.tmp-"), held) for p, held in synced] == [
        (True, "a: 1\n"),
        (False, "a: 2\n"),
    ]
    assert synced[1][0] == str(tmp_path)


def test_a_file_with_hard_links_is_refused_before_it_is_replaced(tmp_path: Path):
    path = tmp_path / "params.yaml"
    path.write_text("a: 1\n")
    os.link(path, tmp_path / "other.yaml")
    with pytest.raises(ConfigError, match="expected 1 link to the file, found 2"):
        yamlfile.target(path)
