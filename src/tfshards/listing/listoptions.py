"""The list stage's options, stated once: its typer command, its DVC command, its params.

:mod:`tfshards.project.stageoptions` turns them into ``tfshards list`` (and
``stages/list_files.py``), the ``dvc.yaml`` command ``tfshards init`` writes,
and the ``list`` section of params.yaml with its comments.
"""

from __future__ import annotations

from tfshards.listing.treefilter import DEFAULT_EXTENSIONS
from tfshards.option import Option

OPTIONS = (
    Option(
        "root", str, "data/raw",
        "Folder or fsspec URL (s3://bucket/raw, gs://..., memory://...) to list.",
        argument=True, param=True,
        comment="local path or any fsspec URL (s3://bucket/prefix, gs://...)",
    ),
    Option(
        "out", str, ...,
        "Folder to write files.jsonl and meta.json into (local path or URL).",
    ),
    Option(
        "index", str | None, None,
        "CSV (.csv, columns path,label) or JSON lines (.jsonl/.json, keys path, label) "
        "with paths relative to ROOT: the listing holds exactly the files it names (files "
        "under ROOT it does not name are not listed, nor counted as skipped). Default: "
        "labels are ROOT's first-level folders.",
    ),
    Option(
        "columns", str | None, None,
        "Extra columns of --index to store with each file, as JSON: name -> type "
        "(int, float, int[], float[], int[N], float[N]) or {\"type\": .., \"min\": .., "
        "\"max\": .., \"multiple\": K}, e.g. '{\"tags\": \"int[]\", \"box\": "
        "{\"type\": \"float[4]\", \"min\": 0, \"max\": 1}}'. A CSV cell holds a JSON "
        "array or numbers separated by spaces or ';'; JSON lines hold arrays.",
    ),
    Option(
        "extensions", str, ",".join(DEFAULT_EXTENSIONS),
        "Comma-separated file suffixes to keep, case-insensitive; '*' (or nothing) keeps "
        "every file.",
        param=True,
        comment="comma-separated; files with other extensions are counted and skipped",
    ),
    Option(
        "glob", str | None, None,
        "fnmatch pattern the path relative to ROOT must match ('*' also matches '/'), "
        "e.g. 'train/*'.",
    ),
    Option(
        "hash_cache", str | None, None,
        "SQLite file remembering each local file's SHA-256 by its stat, so an "
        "unchanged file is not read again; 'none' reads every file. Default: "
        "$TFSHARDS_HASH_CACHE, else ~/.cache/tfshards/listing-hashes.sqlite. "
        "A file there that tfshards did not make is refused and left as it is.",
    ),
    Option(
        "metrics", str | None, None,
        "Also write the counts (files per label, skipped files per reason) as JSON "
        "here: a DVC metric.",
    ),
)  # fmt: skip
