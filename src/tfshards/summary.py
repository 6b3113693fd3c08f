"""Print what a pipeline run produced: ``python -m tfshards.summary`` (the end of ``make demo``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

MANIFEST = Path("data/manifest.json")
VALIDATE_METRICS = Path("results/validate/metrics.json")
TRAIN_METRICS = Path("results/train/metrics.json")


def _load(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def summarize() -> list[str]:
    """One line per stage output that exists, in pipeline order."""
    lines = []
    manifest = _load(MANIFEST)
    if manifest:
        totals = manifest["totals"]
        lines.append(
            f"shards:   {totals['records']} records in {totals['shards']} shards "
            f"({totals['bytes'] / 1e6:.1f} MB, {totals['rejected']} rejected) at {manifest['root']}"
        )
    checked = _load(VALIDATE_METRICS)
    if checked:
        verdict = "OK" if checked.get("ok") else f"{checked.get('problems')} problems"
        lines.append(f"validate: {checked.get('records')} records checked: {verdict}")
    trained = _load(TRAIN_METRICS)
    if trained:
        shown = ("val_accuracy", "val_loss", "epochs", "examples_per_s", "input_bound_fraction")
        parts = [f"{k}={trained[k]:.4g}" for k in shown if isinstance(trained.get(k), float | int)]
        lines.append(f"train:    {' '.join(parts)} on {trained.get('device', '?')}")
    return lines


def main() -> int:
    lines = summarize()
    if not lines:
        print("nothing produced yet: run `dvc repro` first", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
