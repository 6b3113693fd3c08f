"""``tfshards write``: the ``write`` stage; its options are ``tfshards.writing.config.OPTIONS``."""

from __future__ import annotations

from typing import Any

import typer

from tfshards.cli._common import one_line_errors
from tfshards.project import stageoptions
from tfshards.writing.config import OPTIONS, WriteConfig
from tfshards.writing.writer import write


def dashed(token: str) -> str:
    """An option spelled as a ``params.yaml`` key (``--num_shards``), as declared."""
    return token.replace("_", "-")


# The write stage passes its params section through DVC's dict unpacking, which
# spells each option as its key (`--group_by`); click normalizes option names with this.
CONTEXT = {"token_normalize_func": dashed}


def _write(values: dict[str, Any]) -> None:
    config = stageoptions.config(WriteConfig, OPTIONS, values)
    result = write(config, values["listing"], progress=values["progress"])
    m = result.manifest
    typer.echo(
        f"wrote {m.records} records in {len(m.shards)} shards ({m.bytes / 1e6:.1f} MB, "
        f"{len(m.rejected)} rejected, {result.reused} shards reused) to {m.root} "
        f"in {result.seconds:.1f}s"
    )


write_command = one_line_errors(
    stageoptions.command(
        OPTIONS,
        _write,
        name="write_command",
        doc="""Write the listed files into versioned TFRecord shards of tf.train.Example.

    Records are shuffled globally with SEED and cut into shards; the same
    listing and options give byte-identical shards and manifest whatever the
    number of workers. With --group-by, groups are shuffled and packed whole
    into shards, then each shard's records are shuffled. Shards go to
    OUT/<fingerprint>/ and the manifest, written last, commits the set. A
    re-run after a crash keeps the finished shards. Storage credentials come
    from the environment (e.g. AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL), never
    from options.
    """,
    )
)
