"""The real thing: `dvc repro` of dvc.yaml in a temporary git repository."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dvcrepo import run as _run
from tfshards.shardset.manifest import Manifest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh git + DVC repository holding this project's pipeline, reproduced once."""
    root = tmp_path_factory.mktemp("project")
    for name in ("dvc.yaml", "params.yaml", ".dvcignore"):
        shutil.copy(REPO / name, root / name)
    for name in ("stages", "src"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    _run(["git", "init", "-q"], root)
    _run(["dvc", "init", "-q"], root)
    _run(["dvc", "config", "core.analytics", "false"], root)
    _run(["git", "add", "-A"], root)
    _run(["git", "commit", "-qm", "pipeline"], root)
    _run(["dvc", "repro"], root)
    return root


def test_repro_writes_listing_shards_and_manifest(project):
    meta = json.loads((project / "data/listing/meta.json").read_text())
    assert meta["files"] == 1797 and len(meta["labels"]) == 10
    manifest = Manifest.from_json((project / "data/manifest.json").read_bytes())
    assert manifest.records == 1797 and len(manifest.shards) == 16
    assert manifest.root.startswith("data/shards/")
    for shard in manifest.shards:
        assert (project / manifest.root / shard.name).stat().st_size == shard.bytes


def test_validate_passes_and_reports_metrics(project):
    metrics = json.loads((project / "results/validate/metrics.json").read_text())
    assert metrics["ok"] is True and metrics["problems"] == 0
    assert metrics["records"] == 1797
    assert list(metrics)[:3] == ["ok", "problems", "records"]  # what `dvc exp show` lists first


def test_the_default_params_learn_the_digits(project):
    # Any label scrambling anywhere in list -> write -> load would sink this. params.yaml's
    # train section is TrainConfig's defaults (tests/training/test_trainconfig.py).
    metrics = json.loads((project / "results/train/metrics.json").read_text())
    assert metrics["val_accuracy"] >= 0.95 and metrics["epochs"] == 10, metrics
    assert 0.0 <= metrics["input_bound_fraction"] <= 1.0
    assert (project / "models/model.keras").stat().st_size > 0
    split = json.loads((project / "results/train/split.json").read_text())
    assert split  # which shard went where, for lineage


def _leaves(doc: object) -> int:
    return sum(_leaves(v) for v in doc.values()) if isinstance(doc, dict) else 1


def test_dvc_metrics_and_plots_show(project):
    shown = _run(["dvc", "metrics", "show", "--json"], project)
    assert "val_accuracy" in shown
    metrics = json.loads(shown)[""]["data"]
    listing = metrics["results/list/metrics.json"]["data"]
    assert listing == {"files": 1797, "labels": 10, "skipped": 0}
    # `dvc exp show` makes a column of every metric, in file order: few (88 once: per-label
    # counts, per-class accuracy), val_accuracy leading its file.
    assert sum(_leaves(m["data"]) for m in metrics.values()) <= 44
    assert list(metrics["results/train/metrics.json"]["data"])[:2] == ["val_accuracy", "val_loss"]
    validated = metrics["results/validate/metrics.json"]["data"]
    assert validated["duplicates"]["across_splits"] == validated["duplicates"]["groups"] == 0
    # validate holds out the same shards as train, from the same params.
    split = json.loads((project / "results/train/split.json").read_text())
    for side in ("train", "val"):
        counts = validated["split"][side]
        assert counts["records"] == split[side]["records"] > 0
        balance = json.loads((project / f"results/validate/balance/{side}.json").read_text())
        assert sum(row["count"] for row in balance) == counts["records"]
    plots = _run(["dvc", "plots", "show", "--json"], project)
    assert "val_accuracy" in plots
    drawn = json.loads(plots)["data"]
    for side in ("train", "val"):
        (plot,) = drawn[f"results/validate/balance/{side}.json"]
        spec = plot["content"]
        assert spec["mark"]["type"] == "bar"
        assert spec["encoding"]["x"]["field"] == "count"
        assert spec["encoding"]["y"]["field"] == "label"
        rows = spec["data"]["values"]
        assert {r["label"] for r in rows} == {str(i) for i in range(10)}
        assert sum(int(r["count"]) for r in rows) == split[side]["records"]


def test_second_repro_changes_nothing(project):
    before = {p: p.read_bytes() for p in (project / "data").rglob("*") if p.is_file()}
    lock = (project / "dvc.lock").read_bytes()
    output = _run(["dvc", "repro"], project)
    assert "Data and pipelines are up to date." in output
    assert "Running stage" not in output
    after = {p: p.read_bytes() for p in (project / "data").rglob("*") if p.is_file()}
    assert after == before and (project / "dvc.lock").read_bytes() == lock


def _versions(project: Path) -> list[str]:
    return sorted(p.name for p in (project / "data/shards").iterdir() if p.is_dir())


def test_a_changed_param_makes_a_new_version_that_replaces_the_old_in_the_out(project):
    """write.old_versions: remove keeps the DVC out at one version; DVC's cache keeps the rest."""
    old = Manifest.from_json((project / "data/manifest.json").read_bytes())
    _run(["dvc", "repro", "-s", "write", "--force"], project)  # same params: same bytes
    same = Manifest.from_json((project / "data/manifest.json").read_bytes())
    assert same == old
    assert _versions(project) == [old.fingerprint]
    params = (project / "params.yaml").read_text()
    (project / "params.yaml").write_text(params.replace("seed: 42 ", "seed: 7 "))
    try:
        _run(["dvc", "repro", "write"], project)
        new = Manifest.from_json((project / "data/manifest.json").read_bytes())
        assert new.root != old.root
        assert _versions(project) == [new.fingerprint]  # the old one is DVC's to restore
    finally:
        (project / "params.yaml").write_text(params)
        _run(["dvc", "repro", "write"], project)
    assert _versions(project) == [old.fingerprint]
    assert (project / old.root / "manifest.json").exists()


def test_dvc_exp_run_with_a_changed_param_is_listed(project):
    _run(["git", "add", "-A"], project)
    _run(["git", "commit", "-qm", "reproduced"], project)
    _run(["dvc", "exp", "run", "-S", "train.epochs=1", "-n", "one-epoch"], project)
    shown = _run(["dvc", "exp", "show", "--json"], project)
    assert "one-epoch" in shown
    # The validation confusion matrices of the two runs, side by side.
    diff = json.loads(_run(["dvc", "plots", "diff", "HEAD", "one-epoch", "--json"], project))
    (plot,) = diff["data"]["results/train/live/plots/sklearn/confusion_matrix.json"]
    values = plot["content"]["data"]["values"]
    assert {v["rev"] for v in values} == {"HEAD", "one-epoch"}
