"""S3 through a real HTTP endpoint on 127.0.0.1 (moto's server): list, write, resume."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tfshards import storage
from tfshards.cli import app
from tfshards.errors import ShardError
from tfshards.listing.listing import list_files, write_listing
from tfshards.project.sample import write_synthetic
from tfshards.shardset.layout import MANIFEST_NAME
from tfshards.shardset.manifest import Manifest, load
from tfshards.validation.config import ValidateConfig
from tfshards.validation.validate import validate
from tfshards.writing.config import WriteConfig
from tfshards.writing.writer import write

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def raw_on_s3(tmp_path: Path, s3: dict[str, Any]) -> str:
    import s3fs

    local = tmp_path / "raw"
    write_synthetic(str(local), 40, 16, workers=1)
    fs = s3fs.S3FileSystem(**s3)
    fs.put(str(local) + "/", "bucket/raw/", recursive=True)
    return "s3://bucket/raw"


def test_listing_s3_matches_local_paths_and_labels(tmp_path, raw_on_s3, s3):
    remote = list_files(raw_on_s3, storage_options=s3)
    local = list_files(str(tmp_path / "raw"))
    assert [(e.path, e.size, e.label) for e in remote.entries] == [
        (e.path, e.size, e.label) for e in local.entries
    ]
    assert all(e.token for e in remote.entries)  # the ETag


def test_write_to_s3_gives_the_local_bytes_and_resumes(tmp_path, raw_on_s3, s3):
    import s3fs

    local = write(
        WriteConfig(out=str(tmp_path / "out"), num_shards=3, executor="serial"),
        list_files(str(tmp_path / "raw")),
        progress=False,
    ).manifest
    listing = list_files(raw_on_s3, storage_options=s3)
    config = WriteConfig(
        out="s3://bucket/shards",
        num_shards=3,
        workers=2,
        executor="process",
        source_options=s3,
        out_options=s3,
        manifest_copy=str(tmp_path / "manifest.json"),
    )
    remote = write(config, listing, progress=False)
    manifest = remote.manifest
    assert manifest.root.startswith("s3://bucket/shards/")
    fs = s3fs.S3FileSystem(**s3)
    for mine, theirs in zip(manifest.shards, local.shards, strict=True):
        assert fs.cat_file(manifest.shard_url(mine)) == Path(local.shard_url(theirs)).read_bytes()
    assert fs.exists(storage.join(manifest.root, MANIFEST_NAME))
    assert Manifest.from_json((tmp_path / "manifest.json").read_bytes()) == manifest

    fs.rm_file(manifest.shard_url(manifest.shards[1]))  # as if the upload never finished
    again = write(config, listing, progress=False)
    assert again.reused == 2 and again.manifest == manifest


def test_cli_writes_to_s3_with_credentials_from_the_environment(tmp_path, raw_on_s3, s3):
    write_listing(list_files(raw_on_s3, storage_options=s3), str(tmp_path / "listing"))
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": s3["endpoint_url"],  # read by botocore, so by s3fs and DVC
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    result = subprocess.run(
        [
            *(sys.executable, str(REPO / "stages" / "write_shards.py"), str(tmp_path / "listing")),
            *("--out", "s3://bucket/cli", "--manifest", str(tmp_path / "m.json")),
            *("--num-shards", "2", "--no-progress"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "wrote 40 records in 2 shards" in result.stdout
    assert "testing" not in result.stdout + result.stderr


def test_refused_credentials_are_one_line_in_every_command(tmp_path, s3, monkeypatch):
    """s3fs turns a refused request into a bare PermissionError (no file name): each command
    that reads or lists the store says it in one line, never a traceback."""
    import moto.settings

    local = tmp_path / "raw"
    write_synthetic(str(local), 12, 16, workers=1)
    listing = list_files(str(local))
    write_listing(listing, str(tmp_path / "listing"))
    manifest = tmp_path / "manifest.json"
    config = WriteConfig(
        out="s3://bucket/set", num_shards=2, out_options=s3, manifest_copy=str(manifest)
    )
    write(config, listing, progress=False)
    record = listing.entries[0].path
    # moto now checks credentials on every request: the test keys are unknown to it.
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": s3["endpoint_url"],
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    elsewhere = ["--manifest", str(tmp_path / "m2.json"), "--no-progress"]
    commands = [
        ["validate", str(manifest), "--metrics", str(tmp_path / "v.json")],
        ["diff", str(manifest), str(manifest)],
        ["show", str(manifest), record],
        ["prune", "--manifest", str(manifest), "--out", "s3://bucket/set"],
        ["write", str(tmp_path / "listing"), "--out", "s3://bucket/set2", *elsewhere],
    ]
    for args in commands:
        result = subprocess.run(
            [sys.executable, "-m", "tfshards", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1, (args[0], result.stderr)
        assert "Traceback" not in result.stderr and len(lines) == 1, (args[0], result.stderr)
        assert "InvalidAccessKeyId" in lines[0] or "Forbidden" in lines[0], (args[0], lines)


def test_a_bucket_that_does_not_exist_is_named(tmp_path, raw_on_s3, s3):
    listing = list_files(raw_on_s3, storage_options=s3)
    config = WriteConfig(out="s3://nosuchbucket/set", num_shards=2, out_options=s3)
    with pytest.raises(ShardError, match=r"cannot write: the store has no bucket 'nosuchbucket'"):
        write(config, listing, progress=False)


def test_a_local_copy_of_an_s3_version_is_read_for_itself(tmp_path, raw_on_s3, s3):
    """A download of an s3:// version kept the root s3://..., so validate, show and prune
    read the original: a damaged copy validated OK."""
    import s3fs

    listing = list_files(raw_on_s3, storage_options=s3)
    config = WriteConfig(out="s3://bucket/set", num_shards=2, out_options=s3, source_options=s3)
    manifest = write(config, listing, progress=False).manifest
    copy = tmp_path / "copy"
    s3fs.S3FileSystem(**s3).get(f"bucket/set/{manifest.fingerprint}", str(copy), recursive=True)
    assert load(str(copy / "manifest.json")).directory == str(copy)
    first = copy / manifest.shards[0].name
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0xFF
    first.write_bytes(bytes(data))
    report = validate(ValidateConfig(manifest=str(copy / "manifest.json"), executor="serial"))
    assert not report.ok and any(manifest.shards[0].name in str(p) for p in report.problems)


def test_an_output_to_a_bucket_that_does_not_exist_is_refused_not_made(tmp_path, s3, monkeypatch):
    """--metrics s3://typo/m.json made the bucket typo (s3fs' makedirs) and wrote there."""
    import s3fs

    local = tmp_path / "raw"
    write_synthetic(str(local), 6, 16, workers=1)
    config = WriteConfig(out=str(tmp_path / "shards"), num_shards=1)
    manifest = write(config, list_files(str(local)), progress=False).manifest
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3["endpoint_url"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    s3fs.S3FileSystem.clear_instance_cache()
    path = os.path.join(manifest.directory, "manifest.json")
    result = CliRunner().invoke(app, ["validate", path, "--metrics", "s3://typo-bucket/m.json"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert result.stderr.strip().startswith("error: s3://typo-bucket/m.json: "), result.stderr
    assert not s3fs.S3FileSystem(**s3, skip_instance_cache=True).exists("typo-bucket")
