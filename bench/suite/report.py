"""Render benchmark results as the markdown tables of bench/README.md."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.suite import cachelimit, lookup, resume, startup

TITLES = {
    "write": "Write shards (raw JPEG files -> 16 TFRecord shards)",
    "validate": "Validate shards",
    "read": "Read one epoch of decoded (image, label) batches",
    "read resized": "Read one epoch of the large images resized (float32 batches of 128)",
    "read by size": "Read one epoch of JPEGs of each size, resized (float32 batches of 128)",
    "generator": "Parallelize a per-item Python function feeding tf.data",
    "image checks": "Write shards with image checks (write.exif)",
    "near-duplicates": "Validate with the near-duplicate check (validate.near_duplicates)",
}


def _num(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def _spread(s: dict[str, float] | None, digits: int = 2) -> str:
    if s is None:
        return "-"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def _ratio(r: dict[str, Any]) -> str:
    if r["ratio"] is None:
        return "baseline"
    q = r["ratio"]
    return f"**{q['median']:.2f}x** ({q['min']:.2f}-{q['max']:.2f})"


def _of_bound(r: dict[str, Any]) -> str:
    return "-" if r.get("of_bound") is None else f"{r['of_bound']:.0%}"


def render(doc: dict[str, Any]) -> str:
    """The whole report: machine, command, one table per job, memory and the bound."""
    m = doc["machine"]
    rows: Sequence[dict[str, Any]] = doc["rows"]
    lines = [
        f"Machine: {m['cpus']} cores ({m['cpu_model']}), {m['memory_gib']:.0f} GiB, "
        f"Python {m['python']}, TensorFlow {m['tensorflow']}, "
        f"tensorflow-datasets {m['tensorflow_datasets']}; load average {m['load_before']} "
        f"before, {m['load_after']} after. Scale {doc['scale']}, {doc['reps']} repetitions "
        + (
            "with no warm-up (a smoke run: not for tables)"
            if doc.get("quick")
            else "after a warm-up"
        )
        + ", interleaved. Reproduce: "
        f"`{doc['command']}`",
        "",
        "Data: "
        + ", ".join(
            f"{name} = {d['count']:,} JPEGs of {d['size']}x{d['size']} "
            f"(~{d['mean_bytes'] / 1e3:.0f} KB)"
            for name, d in doc["data"].items()
        )
        + " (`tfshards.project.sample.write_synthetic`, 10 classes).",
        "",
        "Speed-up = baseline wall / contender wall within each round (median, min-max). "
        "CPU = seconds of the whole process tree. MB/s counts image payload bytes "
        '(validate: shard bytes). "Of bound" = records/s over what all cores would do '
        "running only the unavoidable steps (last table). Warm-up = the untimed first run "
        "(read, generator: building the dataset, starting its pool, first epoch).",
    ]
    for group, title in TITLES.items():
        group_rows = [r for r in rows if r["group"] == group]
        if not group_rows:
            continue
        lines += [
            "",
            f"#### {title}",
            "",
            "| data | contender | records/s | MB/s | wall s (min-max) | CPU s | speed-up "
            "| of bound | warm-up s |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in group_rows:
            lines.append(
                f"| {r['data']} | {r['name']} | {_num(r['records_per_s'])} | "
                f"{_num(r['mb_per_s'], 1)} | {_spread(r['wall_s'])} | "
                f"{_num(r['cpu_s']['median'], 2)} | {_ratio(r)} | {_of_bound(r)} | "
                f"{_num(r.get('warmup_s'), 2)} |"
            )
    memory = [r for r in rows if r["group"] == "memory"]
    if memory:
        lines += [
            "",
            "#### A whole write in a fresh process, as a DVC stage runs it (small files)",
            "",
            "| contender | files | wall s (min-max) | CPU s | peak RSS MB, all processes "
            "| largest process MB | peak RSS x of 1x |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in memory:
            lines.append(
                f"| {r['name']} | {r['records']:,} | {_spread(r['wall_s'])} | "
                f"{_num(r['cpu_s']['median'], 2)} | {_spread(r['peak_rss_mb'], 0)} | "
                f"{_num(r['peak_single_mb']['median'])} | {r['ratio']['median']:.2f} |"
            )
    lines += _grow([r for r in rows if r["group"] == "grow"])
    lines += startup.table([r for r in rows if r["group"] == "start"])
    lines += lookup.table([r for r in rows if r["group"] == lookup.GROUP])
    lines += resume.table([r for r in rows if r["group"] == "resume"])
    lines += cachelimit.table([r for r in rows if r["group"] == cachelimit.GROUP])
    bound = [r for r in rows if r["group"] == "bound"]
    if bound:
        datas = list(dict.fromkeys(r["data"] for r in bound))
        pieces = list(dict.fromkeys(r["name"] for r in bound))
        cost = {(r["data"], r["name"]): r["us_per_record"] for r in bound}
        lines += [
            "",
            "#### The bound: CPU us per record of each unavoidable step (one core)",
            "",
            "| step | " + " | ".join(datas) + " |",
            "|---|" + "---:|" * len(datas),
        ]
        for piece in pieces:
            cells = " | ".join(_num(cost.get((d, piece)), 1) for d in datas)
            lines.append(f"| {piece} | {cells} |")
        for job, steps in doc["bound_pieces"].items():
            cells = " | ".join(_num(doc["bounds"].get(d, {}).get(job)) for d in datas)
            lines.append(f"| **{job} bound, records/s** ({' + '.join(steps)}) | {cells} |")
    return "\n".join(lines) + "\n"


def _grow(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The growth table: each version's write, against the full write, and what it kept."""
    if not rows:
        return []
    lines = [
        "",
        f"#### Grow a shard set ({rows[0]['records']:,} small files, {rows[0]['shards']} shards "
        "from scratch; each version grown from the one above)",
        "",
        "| step | files | wall s (min-max) | CPU s | of full write | previous shards kept "
        "(same inode) | previous shards rewritten | of them holding a changed or removed file "
        "| new shards | records written |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        grown = "previous_shards" in r
        kept = f"{r['kept']} of {r['previous_shards']}" if grown else "-"
        if grown:
            kept += f" ({r['kept'] / r['previous_shards']:.0%})"
        cells = [
            r["name"],
            f"{r['records']:,}",
            _spread(r["wall_s"]),
            _num(r["cpu_s"]["median"], 2),
            _spread(r["of_full"]),
            kept,
            str(r["rewritten"]) if grown else "-",
            str(r["held_changes"]) if grown else "-",
            str(r["new_shards"]),
            f"{r['records_written']:,}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines
