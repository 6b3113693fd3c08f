"""What a user sees when the input, the options or the storage are hostile: one line, exit 1."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import typer
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
def raw(make_raw: Callable[..., Path]) -> Path:
    return make_raw(6, 16, classes=2)


@pytest.fixture
def listing_dir(raw: Path, tmp_path: Path) -> Path:
    write_listing(list_files(str(raw)), str(tmp_path / "listing"))
    return tmp_path / "listing"


def test_a_metrics_file_where_none_can_be_written_names_it_not_its_temp_file(
    write_set, listing_dir, tmp_path
):
    """/proc holds no new files: the write of its temp file failed, named as the temp."""
    from tfshards.listing.listing import read_listing

    manifest = write_set(read_listing(str(listing_dir)), tmp_path / "shards")
    args = ["validate", f"{manifest.directory}/manifest.json", "--no-progress"]
    code, _, stderr = _invoke(*args, "--metrics", "/proc/x.json")
    assert _one_line(code, stderr) == "error: /proc/x.json: No such file or directory (ENOENT)"


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


# ----------------------------------------------------------------------------- usage


def _run(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args), capture_output=True, text=True, env={**os.environ, **(env or {})}, **kw
    )


TFSHARDS = str(Path(sys.executable).with_name("tfshards"))
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "command",
    [
        [TFSHARDS, "write"],
        [sys.executable, str(REPO / "stages" / "write_shards.py")],
    ],
    ids=["tfshards", "stage-script"],
)
def test_a_params_value_of_the_wrong_type_is_one_line_naming_option_and_value(
    listing_dir, tmp_path, command
):
    # What `num_shards: abc` in params.yaml becomes once DVC has put it on the command line.
    out = _run(*command, str(listing_dir), "--out", str(tmp_path / "s"), "--num-shards", "abc")
    assert out.returncode == 2, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and "╭" not in out.stderr, out.stderr
    assert lines[0].startswith("error: Invalid value for '--num-shards'")
    assert "'abc' is not a valid int" in lines[0] and "--help" in lines[0]


def test_an_unknown_option_is_one_line():
    out = _run(TFSHARDS, "validate", "--bogus")
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert out.stderr.startswith("error: No such option: --bogus")
    assert "goes after `--`" not in out.stderr


def test_a_path_starting_with_a_dash_is_told_to_go_after_two_dashes():
    """`show manifest.json -dash/a.jpg` said only "No such option: -d"."""
    out = _run(TFSHARDS, "show", "manifest.json", "-dash/img000.jpg")
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert out.stderr.startswith(
        "error: No such option: -d; a value that starts with '-' (a path) goes after `--`"
    )


def test_version_prints_the_installed_version():
    import tfshards

    out = _run(TFSHARDS, "--version")
    assert out.returncode == 0 and out.stdout.strip() == f"tfshards {tfshards.__version__}"


def test_train_without_tensorflow_installed_is_one_line_naming_the_extra(
    make_raw, write_set, tmp_path
):
    # A `pip install tfshards` without the [cpu]/[gpu] extra: tensorflow cannot be imported.
    shadow = tmp_path / "shadow" / "tensorflow"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'tensorflow'\", name='tensorflow')\n"
    )
    manifest = tmp_path / "manifest.json"  # a real one: train reads it before importing TF
    raw, shards = make_raw(20, 16, classes=2), tmp_path / "shards"
    write_set(raw, shards, num_shards=2, executor="serial", manifest_copy=str(manifest))
    out = _run(
        TFSHARDS,
        "train",
        "--manifest",
        str(manifest),
        env={"PYTHONPATH": str(shadow.parent)},
        cwd=tmp_path,
    )
    line = _one_line(out.returncode, out.stderr)
    assert "tensorflow, which is not installed" in line and "tfshards[cpu]" in line


def test_an_interrupted_write_is_one_line_and_keeps_what_it_finished(tmp_path):
    raw = tmp_path / "raw"
    write_synthetic(str(raw), 400, 16, classes=4, workers=1)
    write_listing(list_files(str(raw)), str(tmp_path / "listing"))
    # 10 ms a file: the write runs ~4 s, so the interrupt lands while it writes (a plain
    # write of 4,000 files once finished in 0.4 s, before the interrupt reached it).
    (tmp_path / "slowly.py").write_text(
        "import time\n\ndef pause(path, data, label):\n    time.sleep(0.01)\n    return {}\n"
    )
    shards = tmp_path / "shards"
    proc = subprocess.Popen(
        [TFSHARDS, "write", str(tmp_path / "listing"), "--out", str(shards), "--num-shards", "64",
         "--workers", "1", "--executor", "serial", "--manifest", str(tmp_path / "m.json"),
         "--transform", "slowly:pause"],
        stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        # Ctrl-C as at a terminal: a process inherits an ignored SIGINT, and a test run
        # beside this one can leave it ignored in the worker (then the write never stopped)
        preexec_fn=lambda: __import__("signal").signal(2, __import__("signal").SIG_DFL),
    )  # fmt: skip
    deadline = __import__("time").monotonic() + 60
    # a finished shard: its marker in the version's _work folder (the shards move up later)
    while not list(shards.glob("*/_work/*.done")) and proc.poll() is None:
        assert __import__("time").monotonic() < deadline
        __import__("time").sleep(0.05)
    proc.send_signal(__import__("signal").SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == [
        "error: interrupted (finished shards are kept; a write resumes)"
    ], err
    assert not (tmp_path / "m.json").exists()


@pytest.mark.parametrize(
    ("command", "line"),
    [
        ("train", "error: interrupted (the last checkpoint is kept; the next run resumes from it)"),
        ("write", "error: interrupted (finished shards are kept; a write resumes)"),
        ("validate", "error: interrupted"),
    ],
)
def test_an_interrupt_says_what_the_interrupted_command_leaves(command, line, capsys):
    import typer

    from tfshards.cli._common import INTERRUPTED, run_app

    tiny = typer.Typer()

    @tiny.command(name=command)
    def stopped() -> None:
        raise KeyboardInterrupt

    @tiny.command(name="other")
    def other() -> None:  # two commands: the first word names one
        pass

    with pytest.raises(SystemExit) as exited:
        run_app(tiny, [command])
    assert exited.value.code == INTERRUPTED
    assert capsys.readouterr().err.strip().splitlines() == [line]


def test_a_tfshards_warning_is_one_warning_line_and_others_keep_their_form(capsys, monkeypatch):
    import warnings

    import typer

    from tfshards.cli._common import run_app
    from tfshards.shardset.split import SplitWarning

    tiny = typer.Typer()

    @tiny.command(name="warns")
    def warns() -> None:
        line = "val_fraction 0.2: 2 buckets split in steps of 1/2"
        warnings.warn(line, SplitWarning, stacklevel=1)
        warnings.warn("an old argument", DeprecationWarning, stacklevel=1)

    @tiny.command(name="other")
    def other() -> None:
        pass

    def shown(message, category, filename, lineno, file=None, line=None):  # as Python shows
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)  # run_app sets it
    with warnings.catch_warnings(), pytest.raises(SystemExit):
        warnings.simplefilter("always")
        warnings.showwarning = shown  # not pytest's recorder
        run_app(tiny, ["warns"])
    err = capsys.readouterr().err
    assert err.splitlines()[0] == "warning: val_fraction 0.2: 2 buckets split in steps of 1/2"
    assert "DeprecationWarning: an old argument" in err  # Python's form, file and line


def test_the_interrupted_command_is_found_after_global_options():
    from tfshards.cli._common import _command

    assert _command(["--pipeline-version", "0.1.0", "train", "--epochs", "1"]) == "train"
    assert _command(["write", "listing", "--name", "train"]) == "write"
    assert _command(["validate", "m.json"]) == ""  # leaves nothing to resume


def test_a_storage_error_names_the_storage_url_not_the_scheduler_address(capsys):
    from tfshards.cli._common import _say_backend_error

    class EndpointConnectionError(Exception):  # as botocore raises it
        __module__ = "botocore.exceptions"

    kwargs = {"dask_address": "tcp://127.0.0.1:8786", "manifest": "s3://shards/m.json"}
    with pytest.raises(typer.Exit):
        _say_backend_error(EndpointConnectionError("Could not connect"), kwargs)
    assert capsys.readouterr().err == (
        "error: s3://shards/m.json: cannot use remote storage (EndpointConnectionError: "
        "Could not connect)\n"
    )


def test_json_nested_too_deep_is_one_line_naming_the_file_in_every_command(listing_dir, tmp_path):
    """Arrays nested 5,000 deep as a manifest or a meta.json: RecursionError tracebacks."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 5_000 + "]" * 5_000)
    out = str(tmp_path / "shards")
    done = _invoke("write", str(listing_dir), "--out", out, "--manifest", str(tmp_path / "m.json"))
    assert done[0] == 0, done
    commands = [
        ["validate", str(deep)],
        ["show", str(deep)],
        ["diff", str(deep), str(tmp_path / "m.json")],
        ["prune", "--manifest", str(deep), "--out", out],
        ["write", str(listing_dir), "--out", out, "--previous", str(deep)],
    ]
    for args in commands:
        code, _, stderr = _invoke(*args)
        line = _one_line(code, stderr)
        assert line.endswith(
            f"{deep}: expected a manifest, found JSON values nested too deep to read"
        ), args
    code, _, stderr = _invoke("write", str(listing_dir), "--out", out, "--manifest", str(deep))
    assert _one_line(code, stderr).endswith(
        "found a file that is no manifest: pass another --manifest"
    )
    (listing_dir / "meta.json").write_text("[" * 5_000 + "]" * 5_000)
    code, _, stderr = _invoke("write", str(listing_dir), "--out", out)
    line = _one_line(code, stderr)
    assert line.endswith("meta.json: expected a JSON object, found values nested too deep to read")


def test_a_full_disk_under_any_output_is_one_line_naming_the_file(
    raw, listing_dir, tmp_path, monkeypatch
):
    """os.writev and os.fsync name no file: list, a metrics file and diff's printed 50-line
    OSError tracebacks on a full disk."""
    out = str(tmp_path / "shards")
    assert (
        _invoke("write", str(listing_dir), "--out", out, "--manifest", str(tmp_path / "m"))[0] == 0
    )
    real_writev = os.writev

    def full(fd: int, buffers: list[bytes]) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "writev", full)
    commands = {
        "listing/files.jsonl": ["list", str(raw), "--out", str(tmp_path / "listing")],
        "v.json": ["validate", str(tmp_path / "m"), "--metrics", str(tmp_path / "v.json")],
        "d.json": [
            "diff",
            str(tmp_path / "m"),
            str(tmp_path / "m"),
            "--metrics",
            str(tmp_path / "d.json"),
        ],
    }
    for name, args in commands.items():
        code, _, stderr = _invoke(*args)
        line = _one_line(code, stderr)
        assert line == f"error: {tmp_path / name}: No space left on device (ENOSPC)", args
    monkeypatch.setattr(os, "writev", real_writev)


def test_list_replaces_only_listing_files_it_wrote_and_lists_into_no_root(raw, tmp_path):
    """`list --out mydir` replaced a user's meta.json, files.jsonl and files.idx (exit 0),
    and `--out` the root itself was taken."""
    mine = tmp_path / "mydir"
    mine.mkdir()
    for name, text in (("files.idx", "my index\n"), ("files.jsonl", "my lines\n")):
        (mine / name).write_text(text)
        code, _, stderr = _invoke("list", str(raw), "--out", str(mine))
        assert _one_line(code, stderr) == (
            f"error: {mine / name}: expected a listing file that tfshards list wrote (or none), "
            "found a file list did not write: pass another --out or remove it"
        )
        assert (mine / name).read_text() == text
        (mine / name).unlink()
    (mine / "meta.json").write_text('{"my": "meta"}')
    assert _invoke("list", str(raw), "--out", str(mine))[0] == 1
    assert (mine / "meta.json").read_text() == '{"my": "meta"}'
    for inside in (raw, raw / "listing"):
        code, _, stderr = _invoke("list", str(raw), "--out", str(inside))
        assert "expected a folder outside the listed root" in _one_line(code, stderr)
    ours = tmp_path / "ours"
    for _ in range(2):  # its own listing is replaced
        assert _invoke("list", str(raw), "--out", str(ours))[0] == 0


def test_a_metrics_file_replaces_only_json_like_the_one_it_writes(raw, listing_dir, tmp_path):
    """--metrics over a user's notes (or another tool's JSON) replaced it without a word."""
    out = str(tmp_path / "shards")
    assert (
        _invoke("write", str(listing_dir), "--out", out, "--manifest", str(tmp_path / "m"))[0] == 0
    )
    notes, other = tmp_path / "notes.txt", tmp_path / "other.json"
    notes.write_text("my notes\n")
    other.write_text('{"learning_rate": 0.1}\n')
    commands = [
        ["list", str(raw), "--out", str(tmp_path / "l2"), "--metrics"],
        ["validate", str(tmp_path / "m"), "--no-progress", "--metrics"],
        ["diff", str(tmp_path / "m"), str(tmp_path / "m"), "--metrics"],
    ]
    for args in commands:
        for theirs, found in ((notes, "a file that is not JSON"), (other, "JSON with other keys")):
            code, _, stderr = _invoke(*args, str(theirs))
            said = f"{theirs}: expected a new file or a JSON file tfshards wrote there before"
            assert f"{said}, found {found}" in _one_line(code, stderr), args
        assert notes.read_text() == "my notes\n" and other.read_text() == '{"learning_rate": 0.1}\n'
        ours = tmp_path / f"{args[0]}.json"
        for _ in range(2):  # its own metrics are replaced
            assert _invoke(*args, str(ours))[0] == 0, args
    # A manifest and a listing's meta.json are never a metrics file, whatever keys they share.
    manifest = (tmp_path / "m").read_bytes()
    code, _, stderr = _invoke("validate", str(tmp_path / "m"), "--metrics", str(tmp_path / "m"))
    assert _one_line(code, stderr).endswith(
        "found a shard set's manifest: pass another path or remove it"
    )
    assert (tmp_path / "m").read_bytes() == manifest
    meta = tmp_path / "l2" / "meta.json"
    code, _, stderr = _invoke(
        "list", str(raw), "--out", str(tmp_path / "l2"), "--metrics", str(meta)
    )
    assert _one_line(code, stderr).endswith(
        "found a listing's meta.json: pass another path or remove it"
    )
    assert "files_sha256" in meta.read_text()


def test_a_plot_file_replaces_only_rows_like_its_own(listing_dir, tmp_path):
    """validate --balance wrote over a user's JSON list of words (any list passed)."""
    out = str(tmp_path / "shards")
    assert (
        _invoke("write", str(listing_dir), "--out", out, "--manifest", str(tmp_path / "m"))[0] == 0
    )
    plots = tmp_path / "bal"
    plots.mkdir()
    (plots / "train.json").write_text('["my", "todo", "list"]')
    args = ["validate", str(tmp_path / "m"), "--no-progress", "--balance", str(plots)]
    code, _, stderr = _invoke(*args)
    assert "found JSON of another kind (str)" in _one_line(code, stderr)
    assert (plots / "train.json").read_text() == '["my", "todo", "list"]'
    (plots / "train.json").unlink()
    for _ in range(2):  # its own rows are replaced
        assert _invoke(*args)[0] == 0


def test_validate_writes_no_output_until_each_may_be_written(listing_dir, tmp_path):
    """Its outputs were written one by one, so a refusal of the last left the first
    written; a user's file was replaced whenever the new content was empty (the val side
    at val_fraction 0); a metrics file inside the version folder failed the next run."""
    out = str(tmp_path / "shards")
    assert (
        _invoke("write", str(listing_dir), "--out", out, "--manifest", str(tmp_path / "m"))[0] == 0
    )
    plots = tmp_path / "plots"
    plots.mkdir()
    (plots / "val.json").write_text('[{"todo": "x"}]')  # the val side is [] at val_fraction 0
    args = ["validate", str(tmp_path / "m"), "--no-progress", "--val-fraction", "0"]
    code, _, stderr = _invoke(
        *args, "--metrics", str(tmp_path / "v.json"), "--image-plots", str(plots)
    )
    said = "val.json: expected a new file or a JSON file tfshards wrote there before, found"
    assert f"{said} JSON with other keys" in _one_line(code, stderr)
    assert not (tmp_path / "v.json").exists() and not (plots / "train.json").exists()
    assert (plots / "val.json").read_text() == '[{"todo": "x"}]'
    version = next(Path(out).iterdir())
    code, _, stderr = _invoke(*args, "--metrics", str(version / "metrics.json"))
    assert "expected a path outside every shard version folder" in _one_line(code, stderr)
    assert not (version / "metrics.json").exists()


def test_no_output_goes_into_any_version_folder(raw, listing_dir, tmp_path):
    """list --out, validate/diff --metrics and show --png into another set's version folder
    wrote files there, and that version then failed validate."""
    out, other = str(tmp_path / "shards"), str(tmp_path / "other")
    assert (
        _invoke("write", str(listing_dir), "--out", out, "--manifest", str(tmp_path / "m"))[0] == 0
    )
    args = ["write", str(listing_dir), "--out", other, "--manifest", str(tmp_path / "m2")]
    assert _invoke(*args, "--seed", "3")[0] == 0
    theirs = next(Path(other).iterdir())
    m = str(tmp_path / "m")
    record = next(p.relative_to(raw).as_posix() for p in sorted(raw.rglob("*.jpg")))
    commands = [
        ["list", str(raw), "--out", str(theirs / "l")],
        ["list", str(raw), "--out", str(tmp_path / "l"), "--metrics", str(theirs / "l.json")],
        ["validate", m, "--no-progress", "--metrics", str(theirs / "v.json")],
        ["diff", m, m, "--metrics", str(theirs / "d.json")],
        ["show", m, record, "--png", str(theirs / "x.png")],
    ]
    before = sorted(p.name for p in theirs.rglob("*"))
    for args in commands:
        code, _, stderr = _invoke(*args)
        assert "expected a path outside every shard version folder" in _one_line(code, stderr), args
    assert sorted(p.name for p in theirs.rglob("*")) == before
    assert _invoke("validate", str(theirs), "--no-progress")[0] == 0
