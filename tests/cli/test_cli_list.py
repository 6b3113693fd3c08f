"""``tfshards list`` and ``stages/list_files.py``: summary line, one-line errors, --help."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest
from PIL import Image
from typer.testing import CliRunner

from tfshards.cli import app

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    root = tmp_path / "raw"
    for rel in ("cat/1.jpg", "cat/2.png", "dog/3.jpeg", "dog/notes.txt", "top.jpg", ".DS_Store"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x" * 10)
    return root


def test_list_writes_listing_and_prints_one_summary_line(raw: Path, tmp_path: Path) -> None:
    out = tmp_path / "listing"
    result = runner.invoke(app, ["list", str(raw), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        "listed 3 files in 2 labels (skipped: 3 = 1 hidden, 1 of another extension, "
        f"1 outside a label folder) -> {out}\n"
    )
    meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    assert meta["files_per_label"] == {"cat": 2, "dog": 1}
    assert meta["skipped"] == {
        "extension": 1,
        "glob": 0,
        "hidden": 1,
        "no-label": 1,
        "not-a-file": 0,
    }


def test_list_writes_its_counts_as_a_metrics_file(raw: Path, tmp_path: Path) -> None:
    metrics = tmp_path / "results" / "list" / "metrics.json"
    args = ["list", str(raw), "--out", str(tmp_path / "listing"), "--metrics", str(metrics)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    # Few numbers, for `dvc exp show`; per label and per reason: the listing's meta.json.
    assert json.loads(metrics.read_text(encoding="utf-8")) == {
        "files": 3,
        "labels": 2,
        "skipped": 3,
    }


def test_list_options_reach_the_listing(raw: Path, tmp_path: Path) -> None:
    out = tmp_path / "listing"
    args = ["list", str(raw), "--out", str(out), "--extensions", "JPG,txt", "--glob", "cat/*"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("listed 1 files in 1 labels (skipped: 5 = ")


def test_list_with_index_and_memory_output(raw: Path, tmp_path: Path) -> None:
    index = tmp_path / "labels.jsonl"
    index.write_text('{"path": "dog/3.jpeg", "label": "any"}\n', encoding="utf-8")
    result = runner.invoke(app, ["list", str(raw), "--out", "memory://l", "--index", str(index)])
    assert result.exit_code == 0, result.output
    assert result.stdout == "listed 1 files in 1 labels (skipped: 0) -> memory://l\n"
    assert fsspec.filesystem("memory").exists("/l/files.jsonl")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{tmp}/nope"], "{tmp}/nope: root folder not found"),
        (["{raw}/top.jpg"], "{raw}/top.jpg: expected a folder of files, found a file"),
        (["{empty}"], "{empty}: expected label folders with files, found no files"),
        (
            ["{raw}", "--glob", "zebra/*"],
            "{raw}: no file to list: all 6 entries were skipped (1 hidden, 1 of another "
            "extension, 4 outside the glob; kept: extensions .bmp,.gif,.jpeg,.jpg,.png,.webp, "
            "glob 'zebra/*')",
        ),
        (["{raw}", "--index", "{tmp}/i.tsv"], "{tmp}/i.tsv: unknown index format"),
        (["{raw}", "--index", "{tmp}/i.csv"], "{tmp}/i.csv: index file not found"),
    ],
)
def test_list_errors_are_one_line_on_stderr_with_exit_1(
    raw: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "empty").mkdir()
    fill = {"tmp": tmp_path, "raw": raw, "empty": tmp_path / "empty"}
    argv = ["list", *(a.format(**fill) for a in args), "--out", str(tmp_path / "out")]
    result = runner.invoke(app, argv)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("error: " + message.format(**fill))
    assert result.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_index_error_names_file_line_and_path(raw: Path, tmp_path: Path) -> None:
    index = tmp_path / "i.csv"
    index.write_text("path,label\ncat/1.jpg,a\ncat/9.jpg,a\n", encoding="utf-8")
    result = runner.invoke(app, ["list", str(raw), "--out", "o", "--index", str(index)])
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: {index}:3: cat/9.jpg: expected a file under {raw}, found nothing\n"
    )


def test_missing_out_option_is_a_usage_error(raw: Path) -> None:
    result = runner.invoke(app, ["list", str(raw)])
    assert result.exit_code == 2
    assert "--out" in result.output


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )


def test_stage_script_help_runs_in_a_real_process() -> None:
    result = _run("stages/list_files.py", "--help")
    assert result.returncode == 0, result.stderr
    assert "--out" in result.stdout and "--index" in result.stdout
    assert "ImageFolder" in result.stdout


def test_module_cli_help_runs_in_a_real_process() -> None:
    result = _run("-m", "tfshards", "list", "--help")
    assert result.returncode == 0, result.stderr
    assert "--extensions" in result.stdout and "--glob" in result.stdout


def test_stage_script_lists_in_a_real_process(raw: Path, tmp_path: Path) -> None:
    result = _run("stages/list_files.py", str(raw), "--out", str(tmp_path / "l"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("listed 3 files in 2 labels")
    bad = _run("stages/list_files.py", str(tmp_path / "nope"), "--out", str(tmp_path / "l"))
    assert bad.returncode == 1
    assert bad.stderr == f"error: {tmp_path / 'nope'}: root folder not found\n"


def test_a_listing_made_in_the_project_folder_is_written_from_a_subfolder(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    (project / ".dvc").mkdir(parents=True)
    for label in ("cat", "dog"):
        (project / "data/raw" / label).mkdir(parents=True)
        for i in range(3):
            Image.new("L", (4, 4), 40 * i).save(project / "data/raw" / label / f"{i}.png")
    tfshards = [sys.executable, "-m", "tfshards"]
    listed = subprocess.run(
        [*tfshards, "list", "data/raw", "--out", "data/listing", "--extensions", ".png"],
        cwd=project, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert json.loads((project / "data/listing/meta.json").read_text())["root"] == "data/raw"
    (project / "notebooks").mkdir()
    wrote = subprocess.run(
        [*tfshards, "write", "../data/listing", "--out", "../data/shards", "--num-shards", "2",
         "--manifest", "../data/manifest.json", "--no-progress"],
        cwd=project / "notebooks", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert wrote.returncode == 0, wrote.stderr
    manifest = json.loads((project / "data/manifest.json").read_text())
    assert manifest["totals"]["records"] == 6


def test_a_bad_columns_declaration_is_one_line(raw: Path, tmp_path: Path) -> None:
    (tmp_path / "i.csv").write_text("path,label,box\ncat/1.jpg,cat,0 0 1 1\n")
    args = ["list", str(raw), "--out", str(tmp_path / "l"), "--index", str(tmp_path / "i.csv")]
    result = runner.invoke(app, [*args, "--columns", '{"box": "float[4"}'])
    assert result.exit_code == 1
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1 and "columns: box: expected int, float, int[]" in lines[0], lines
    result = runner.invoke(app, [*args, "--columns", '{"box": "float[3]"}'])
    assert result.exit_code == 1
    assert "i.csv:2: column 'box' (float[3]): expected 3 values, found 4" in result.output
