"""What a user sees when the input, the options or the storage are hostile: one line, exit 1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfshards.cli import app
from tfshards.listing.listing import list_files, write_listing
from tfshards.project.sample import write_synthetic

SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY"


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def _one_line(code: int, stderr: str) -> str:
    assert code == 1, stderr
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    out = tmp_path / "raw"
    write_synthetic(str(out), 6, 16, classes=2, workers=1)
    return out


@pytest.fixture
def listing_dir(raw: Path, tmp_path: Path) -> Path:
    write_listing(list_files(str(raw)), str(tmp_path / "listing"))
    return tmp_path / "listing"


# ----------------------------------------------------------------------------- list


def test_a_file_symlink_loop_under_the_root_is_one_line(raw, tmp_path):
    (raw / "00" / "a.jpg").symlink_to("b.jpg")
    (raw / "00" / "b.jpg").symlink_to("a.jpg")
    code, _, stderr = _invoke("list", str(raw), "--out", str(tmp_path / "listing"))
    line = _one_line(code, stderr)
    assert line.startswith(f"error: {raw}/00/")
    assert line.endswith(".jpg: cannot read (Too many levels of symbolic links, ELOOP)")


def test_a_path_longer_than_path_max_under_the_root_is_one_line(raw, tmp_path):
    deep = raw / "00"
    fd = os.open(deep, os.O_RDONLY)
    try:  # build it relative to an open folder: the full path is too long for any call
        for _ in range(22):
            os.mkdir("d" * 200, dir_fd=fd)
            inner = os.open("d" * 200, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        os.close(os.open("x.jpg", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    finally:
        os.close(fd)
    code, _, stderr = _invoke("list", str(raw), "--out", str(tmp_path / "listing"))
    line = _one_line(code, stderr)
    assert line.startswith(f"error: {raw}/00/ddd")
    assert "cannot read (expected a path of at most 4096 bytes, found " in line
    assert line.endswith("File name too long, ENAMETOOLONG)")


def test_a_read_only_listing_folder_is_one_line(raw, read_only):
    code, _, stderr = _invoke("list", str(raw), "--out", str(read_only / "listing"))
    assert _one_line(code, stderr) == f"error: {read_only}/listing: Read-only file system (EROFS)"


@pytest.mark.parametrize(
    ("name", "text", "line"),
    [
        ("index.csv", 'path,label\n00/000000.jpg,a\n"00/x\0y.jpg",b\n', 3),
        (
            "index.jsonl",
            '{"path": "00/000000.jpg", "label": "a"}\n{"path": "00/x\\u0000y.jpg", "label": "b"}\n',
            2,
        ),
    ],
)
def test_a_nul_in_an_index_path_is_one_line_naming_the_line(raw, tmp_path, name, text, line):
    index = tmp_path / name
    index.write_text(text)
    code, _, stderr = _invoke("list", str(raw), "--out", str(tmp_path / "l"), "--index", str(index))
    assert _one_line(code, stderr) == (
        f"error: {index}:{line}: expected a path without NUL characters, found '00/x\\x00y.jpg'"
    )


# ----------------------------------------------------------------------------- options


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0"])
def test_a_target_shard_size_that_is_no_size_is_one_line(listing_dir, tmp_path, value):
    code, _, stderr = _invoke(
        *("write", str(listing_dir), "--out", str(tmp_path / "o"), "--target-shard-mb", value)
    )
    line = _one_line(code, stderr)
    assert line == (
        f"error: --target-shard-mb: expected a number of MiB above 0, got {float(value)}"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["list", f"s3://AKIAEXAMPLE:{SECRET}@bucket/raw", "--out", "listing"],
        ["list", "raw", "--out", f"s3://AKIAEXAMPLE:{SECRET}@bucket/listing"],
        ["list", "raw", "--out", "l", "--index", f"s3://AKIAEXAMPLE:{SECRET}@bucket/i.csv"],
        ["write", "listing", "--out", f"s3://AKIAEXAMPLE:{SECRET}@bucket/shards"],
        ["write", "listing", "--manifest", f"s3://AKIAEXAMPLE:{SECRET}@bucket/m.json"],
        ["write", f"s3://AKIAEXAMPLE:{SECRET}@bucket/listing"],
        ["write", "listing", "--dask-address", f"tcp://user:{SECRET}@scheduler:8786"],
        ["validate", f"s3://AKIAEXAMPLE:{SECRET}@bucket/m.json"],
        ["train", "--manifest", f"gs://user:{SECRET}@bucket/m.json"],
        ["sample", "synthetic", f"s3://AKIAEXAMPLE:{SECRET}@bucket/raw"],
        ["sample", "digits", f"https://user:{SECRET}@example.org/raw"],
    ],
)
def test_a_password_in_any_url_is_refused_and_never_echoed(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = _invoke(*args)
    line = _one_line(code, stderr)
    assert "://...: URL contains a password; expected credentials from the environment" in line
    assert SECRET not in stdout + stderr
    assert not list(tmp_path.iterdir())  # nothing was attempted


# ----------------------------------------------------------------------------- S3


@pytest.fixture
def stopped_endpoint() -> str:
    """The address of a moto S3 server that was started, then stopped."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    server.stop()
    return f"http://{host}:{port}"


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """A real process: the environment (credentials, endpoint) is read as a user's would be."""
    return subprocess.run(
        [sys.executable, "-m", "tfshards", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


def _aws_env(endpoint: str, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {"FSSPEC_S3_ENDPOINT_URL": endpoint, "AWS_MAX_ATTEMPTS": "1"}
    env |= {"AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}
    env |= {"AWS_EC2_METADATA_DISABLED": "true"}
    return env | more


@pytest.mark.slow
@pytest.mark.parametrize("command", ["write", "list", "validate"])
def test_an_unreachable_s3_endpoint_is_one_line(listing_dir, stopped_endpoint, tmp_path, command):
    args = {
        "write": ["write", str(listing_dir), "--out", "s3://bucket/shards", "--no-progress"],
        "list": ["list", "s3://bucket/raw", "--out", str(tmp_path / "l2")],
        "validate": ["validate", "s3://bucket/shards/manifest.json", "--no-progress"],
    }[command]
    env = _aws_env(stopped_endpoint, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    proc = _cli(args, env, tmp_path)
    line = _one_line(proc.returncode, proc.stderr)
    assert line.startswith("error: s3://bucket/")
    assert (
        f'EndpointConnectionError: Could not connect to the endpoint URL: "{stopped_endpoint}/'
        in line
    )


@pytest.mark.slow
def test_no_s3_credentials_is_one_line_saying_where_they_come_from(listing_dir, endpoint, tmp_path):
    args = ["write", str(listing_dir), "--out", "s3://bucket/shards", "--no-progress"]
    proc = _cli(args, _aws_env(endpoint), tmp_path)
    line = _one_line(proc.returncode, proc.stderr)
    assert line == (
        "error: s3://bucket/shards: cannot use remote storage (NoCredentialsError: Unable to "
        "locate credentials); expected credentials from the environment (AWS_* variables, "
        "a profile) or fsspec config"
    )
