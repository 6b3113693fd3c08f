"""`tfshards train`: what DVC writes is parsed, errors are one line, --help needs no TensorFlow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfshards.cli import app
from tfshards.project.stageoptions import parse_bool, parse_pairs

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("text", "expected"), [("true", True), ("False", False), ("1", True)])
def test_bool_options_take_what_dvc_writes(text: str, expected: bool) -> None:
    assert parse_bool(text, "--deterministic") is expected


def test_model_args_take_what_dvc_writes_for_a_mapping() -> None:
    # DVC renders {units: 8, rate: 0.5, name: wide, bn: true, sizes: [1, 2]} like this.
    args = ["--units", "8", "--rate", "0.5", "--name", "wide", "--bn", "--sizes", "1", "2"]
    assert parse_pairs(args, "--model-args") == {
        "units": 8,
        "rate": 0.5,
        "name": "wide",
        "bn": True,
        "sizes": [1, 2],
    }
    assert parse_pairs([], "--model-args") == {}


def test_unknown_model_on_the_command_line_is_one_line_and_exit_1() -> None:
    result = CliRunner().invoke(app, ["train", "--model", "vgg"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "error: unknown model 'vgg'; valid names: mobilenet_v3_small, small_cnn, "
        "or package.module:function"
    ]


def test_a_bool_option_that_is_not_a_bool_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["train", "--jit-compile", "sometimes"])
    assert result.exit_code == 2
    assert "expected true or false" in result.output


def test_stage_script_help_runs_in_a_real_process_without_tensorflow() -> None:
    done = subprocess.run(
        [sys.executable, "stages/train.py", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    for option in ("--epochs", "--image-size", "--mixed-precision", "--live-dir", "--split-out"):
        assert option in done.stdout
    probe = "import sys, tfshards.cli; print('tensorflow' in sys.modules, 'keras' in sys.modules)"
    imported = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert imported.stdout.split() == ["False", "False"], imported.stderr


MISSING_MANIFEST = """
import sys
from tfshards.cli import main
sys.argv = ["tfshards", "train", "--manifest", "nowhere/manifest.json"]
try:
    main()
except SystemExit as exit:
    print("exit", exit.code, "tensorflow" in sys.modules, file=sys.stderr)
"""


def test_missing_manifest_is_said_before_tensorflow_is_imported(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", MISSING_MANIFEST],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == "exit 1 False", done.stderr
    assert "nowhere/manifest.json" in lines[-2] and "Traceback" not in done.stderr


def test_missing_model_module_is_one_line_and_exit_1(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{}")
    result = CliRunner().invoke(
        app,
        ["train", "--manifest", str(tmp_path / "manifest.json"), "--model", "nopkg.nomod:build"],
    )
    assert result.exit_code == 1
    assert result.output.startswith("error: model 'nopkg.nomod:build': cannot import 'nopkg.nomod'")
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("module", "source", "said"),
    [
        (
            "syntax_error_model",
            "def build(input_shape, classes):\n    return (\n",
            "cannot import 'syntax_error_model': SyntaxError: '(' was never closed "
            "(syntax_error_model.py, line 2)",
        ),
        (
            "raising_import_model",
            "import os\n\nSIZE = int(os.environ.get('NO_SUCH_SIZE', 'wide'))\n",
            "cannot import 'raising_import_model': ValueError: invalid literal for int() "
            "with base 10: 'wide' (raising_import_model.py:3)",
        ),
    ],
)
def test_a_model_module_that_fails_to_import_is_one_line_naming_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, source: str, said: str
) -> None:
    (tmp_path / f"{module}.py").write_text(source)
    (tmp_path / "manifest.json").write_text("{}")  # never read: the module fails first
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        app, ["train", "--manifest", "manifest.json", "--model", f"{module}:build"]
    )
    assert result.exit_code == 1
    assert result.output == f"error: model '{module}:build': {said}\n"
