"""`tfshards init` in a new repository, for real: the README's steps, `dvc repro` before the
first commit, clones up to date, and shards on S3 (moto's server on 127.0.0.1)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from dvcrepo import run as _run
from tfshards.project.sample import SyntheticSpec, render_synthetic, write_synthetic
from tfshards.shardset.manifest import Manifest

pytestmark = pytest.mark.slow
UP_TO_DATE = "Data and pipelines are up to date."


def _new_repo(root: Path, env: dict[str, str], *init_args: str, track_raw: bool = False) -> None:
    """`git init`, `dvc init`, 48 tiny images in 4 classes, `tfshards init`, one epoch."""
    root.mkdir()
    _run(["git", "init", "-q"], root, env)
    _run(["dvc", "init", "-q"], root, env)
    write_synthetic(str(root / "data" / "raw"), 48, 16, classes=4, workers=1)
    if track_raw:
        _run(["dvc", "add", "-q", "data/raw"], root, env)
    _run(["tfshards", "init", "--image-size", "8", *init_args], root, env)
    params = root / "params.yaml"
    params.write_text(params.read_text().replace("epochs: 10", "epochs: 1", 1))


def _ran(output: str) -> list[str]:
    return [s for s in ("list", "write", "validate", "train") if f"Running stage '{s}'" in output]


def _readme_steps() -> list[str]:
    """The commands of README.md's "Use it in your own repository" block that sets a repo up."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text.split("\n## Use it in your own repository\n", 1)[1].split("\n## ", 1)[0]
    block = next(b for b in re.findall(r"```bash\n(.*?)```", section, re.S) if "tfshards init" in b)
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def _throw_away_recipe() -> str:
    """docs/project.md's command that throws an experiment's workspace away."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "project.md").read_text()
    section = text.split("To throw an experiment's workspace away", 1)[1]
    return re.findall(r"```bash\n(.*?)```", section, re.S)[0].strip()


def _tracked(root: Path, env: dict[str, str]) -> list[str]:
    return _run(["git", "ls-files"], root, env).split()


def test_the_readme_steps_keep_images_and_checkpoints_out_of_git_and_clones_up_to_date(tmp_path):
    """The README's steps as written, in a brand-new repository; then a version later, a clone."""
    root = tmp_path / "project"
    env = {"TFSHARDS_CACHE": str(tmp_path / "cache")}
    root.mkdir()
    _run(["git", "init", "-q"], root, env)
    _run(["dvc", "init", "-q"], root, env)
    write_synthetic(str(root / "data" / "raw"), 48, 16, classes=4, workers=1)
    steps = _readme_steps()
    assert steps == ["tfshards init", "dvc repro", "git add -A && git commit -m pipeline"]
    _run(["bash", "-c", steps[0]], root, env)
    params = root / "params.yaml"  # the test's one change: one epoch of 8 px images
    text = params.read_text().replace("epochs: 10", "epochs: 1", 1)
    params.write_text(text.replace("image_size: 64", "image_size: 8", 1))
    first = _run(["bash", "-c", steps[1]], root, env)  # no commit yet: dvclive must cope
    assert _ran(first) == ["list", "write", "validate", "train"]
    assert (root / "results/train/live/plots/metrics").is_dir()  # dvclive logged anyway
    (root / "checkpoints/train").mkdir(parents=True)  # what a killed run leaves
    (root / "checkpoints/train/state.json").write_text("{}")
    _run(["bash", "-c", steps[2]], root, env)

    tracked = _tracked(root, env)
    assert "data/raw.dvc" in tracked and "dvc.yaml" in tracked and "params.yaml" in tracked
    assert not [
        p
        for p in tracked
        if p.startswith(("data/", "checkpoints/", "models/"))
        and p != "data/raw.dvc"
        and not p.endswith(".gitignore")
    ], tracked
    assert UP_TO_DATE in _run(["dvc", "status"], root, env)
    assert _ran(_run(["dvc", "repro"], root, env)) == []
    shutil.rmtree(root / "checkpoints")  # not tfshards' (no marker): train would refuse it
    old = Manifest.from_json((root / "data/manifest.json").read_bytes())
    assert old.records == 48

    # An experiment on one more image, thrown away as docs/project.md says: the image stays
    # (a bare `dvc checkout` deleted it), HEAD's version and params come back; then applied.
    fresh = root / "data/raw/00/fresh.jpg"  # a JPEG, as write_synthetic makes
    fresh.write_bytes(render_synthetic(SyntheticSpec(1, 16, classes=1, seed=9), 0))
    params_before = params.read_text()
    _run(["dvc", "exp", "run", "-n", "seed5", "-S", "write.seed=5"], root, env)
    assert Manifest.from_json((root / "data/manifest.json").read_bytes()).records == 49
    _run(["bash", "-c", _throw_away_recipe()], root, env)
    assert fresh.is_file() and params.read_text() == params_before
    assert Manifest.from_json((root / "data/manifest.json").read_bytes()) == old
    _run(["dvc", "exp", "apply", "seed5"], root, env)

    # A second version, committed: the shard out holds it alone (write.old_versions: remove).
    new = Manifest.from_json((root / "data/manifest.json").read_bytes())
    assert new.root != old.root and new.records == 49
    assert [p.name for p in (root / "data/shards").iterdir()] == [Path(new.root).name]
    _run(["dvc", "remote", "add", "-q", "-d", "store", str(tmp_path / "remote")], root, env)
    _run(["bash", "-c", "git add -A && git commit -qm 'seed 5' && dvc push -q"], root, env)

    # A clone never saw the first version; it is up to date and retrains nothing.
    clone = tmp_path / "clone"
    _run(["git", "clone", "-q", str(root), str(clone)], tmp_path, env)
    _run(["dvc", "pull", "-q"], clone, env)
    assert UP_TO_DATE in _run(["dvc", "status"], clone, env)
    assert _ran(_run(["dvc", "repro"], clone, env)) == []

    # Back in the first repository, the first version comes back from DVC's cache.
    _run(["git", "checkout", "-q", "HEAD~1"], root, env)
    _run(["dvc", "checkout", "--force"], root, env)
    assert (root / old.root / "manifest.json").exists() and not (root / new.root).exists()
    assert UP_TO_DATE in _run(["dvc", "status"], root, env)


@pytest.fixture
def s3_env(tmp_path: Path, endpoint: str) -> dict[str, str]:
    """One endpoint variable for DVC and tfshards alike, AWS_ENDPOINT_URL, and a fresh bucket.

    ``_run`` drops fsspec's own FSSPEC_S3_ENDPOINT_URL, so tfshards must do without it.
    """
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "TFSHARDS_CACHE": str(tmp_path / "cache"),
    }
    import boto3

    boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket="bucket")
    return env


def test_remote_shards_reproduce_up_to_date_from_a_fresh_clone(tmp_path, s3_env):
    import s3fs

    origin = tmp_path / "origin"
    # The README's commands, in its order (plus tiny images and one epoch).
    _new_repo(origin, s3_env, "--shards", "s3://bucket/shards", track_raw=True)
    _run(["dvc", "remote", "add", "-d", "store", "s3://bucket/dvc"], origin, s3_env)
    assert _ran(_run(["dvc", "repro"], origin, s3_env)) == ["list", "write", "validate", "train"]
    manifest = Manifest.from_json((origin / "data/manifest.json").read_bytes())
    assert manifest.root.startswith("s3://bucket/shards/")
    assert not (origin / "data/shards").exists()
    _run(["git", "add", "-A"], origin, s3_env)
    _run(["git", "commit", "-qm", "pipeline on S3"], origin, s3_env)
    _run(["dvc", "push", "-q"], origin, s3_env)

    clone = tmp_path / "clone"
    _run(["git", "clone", "-q", str(origin), str(clone)], tmp_path, s3_env)
    _run(["dvc", "pull", "-q"], clone, s3_env)
    assert UP_TO_DATE in _run(["dvc", "status"], clone, s3_env)
    again = _run(["dvc", "repro"], clone, s3_env)
    assert UP_TO_DATE in again and _ran(again) == []

    cached = sorted(p.name for p in (tmp_path / "cache").rglob("*.tfrecord"))
    assert cached == sorted(f"{s.sha256}.tfrecord" for s in manifest.shards)  # train's reads

    params = clone / "params.yaml"
    params.write_text(params.read_text().replace("seed: 0 ", "seed: 3 ", 1))  # write.seed
    changed = _run(["dvc", "repro", "validate"], clone, s3_env)  # training left out: time
    assert _ran(changed) == ["write", "validate"]
    new = Manifest.from_json((clone / "data/manifest.json").read_bytes())
    assert new.root != manifest.root
    fs = s3fs.S3FileSystem(endpoint_url=s3_env["AWS_ENDPOINT_URL"], key="testing", secret="testing")
    for version in (manifest, new):  # DVC deleted nothing under the prefix
        assert fs.exists(f"{version.root}/manifest.json")
    status = _run(["dvc", "status"], clone, s3_env)
    assert "train:" in status and "write:" not in status and "validate:" not in status


def test_group_by_param_reaches_the_write_stage_through_dvc_and_the_shell(tmp_path):
    root = tmp_path / "project"
    env = {"TFSHARDS_CACHE": str(tmp_path / "cache")}
    _new_repo(root, env)
    params = root / "params.yaml"
    text = params.read_text()
    assert "group_by: none" in text  # scaffolded: no grouping unless asked
    text = text.replace("group_by: none", "group_by: '(\\d)\\.jpg$'", 1)
    params.write_text(text.replace("num_shards: 0", "num_shards: 4", 1))
    assert _ran(_run(["dvc", "repro", "validate"], root, env)) == ["list", "write", "validate"]
    manifest = Manifest.from_json((root / "data/manifest.json").read_bytes())
    assert manifest.params["group_by"] == r"(\d)\.jpg$" and len(manifest.shards) == 4
    metrics = json.loads((root / "results/validate/metrics.json").read_text())
    assert metrics["grouping"] == {"groups": 10, "spanning_shards": 0}


def test_a_group_by_with_quotes_and_substitutions_reaches_write_literally_and_runs_nothing(
    tmp_path,
):
    root = tmp_path / "project"
    env = {"TFSHARDS_CACHE": str(tmp_path / "cache")}
    _new_repo(root, env)
    # The first branch groups by the last digit; the second never matches a path,
    # and holds every way out of shell quoting: ' ends a '...' word, " and $(...)
    # and `...` run in a "..." one, ; and $VAR in a bare one.
    planted = r"""(\d)\.jpg$|x'; touch PWNED1; echo '"$(touch PWNED2)"`touch PWNED3`;$HOME"""
    params = root / "params.yaml"
    text = params.read_text().replace("group_by: none", f"group_by: {json.dumps(planted)}", 1)
    params.write_text(text.replace("num_shards: 0", "num_shards: 4", 1))
    assert _ran(_run(["dvc", "repro", "write"], root, env)) == ["list", "write"]
    assert not list(root.rglob("PWNED*")) and not list(Path.cwd().glob("PWNED*"))
    manifest = Manifest.from_json((root / "data/manifest.json").read_bytes())
    assert manifest.params["group_by"] == planted
    assert len(manifest.shards) == 4 and manifest.records == 48
