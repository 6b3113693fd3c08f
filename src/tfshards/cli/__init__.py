"""The ``tfshards`` command: one subcommand per pipeline stage.

Each subcommand is the same function the matching ``stages/*.py`` script runs,
so options are defined once. None of these modules imports TensorFlow at import
time, so ``tfshards --help`` answers at once.
"""

from __future__ import annotations

import typer

from tfshards.cli.list import list_files_command
from tfshards.cli.prune import prune_command
from tfshards.cli.sample import sample_app
from tfshards.cli.train import train_command
from tfshards.cli.validate import validate_command
from tfshards.cli.write import write_command

app = typer.Typer(
    name="tfshards",
    help="Turn raw files into reproducible, validated TFRecord shards (DVC pipeline stages).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# In pipeline order: sample -> list -> write -> validate -> train.
app.add_typer(sample_app, name="sample")
app.command("list")(list_files_command)
app.command("write")(write_command)
app.command("validate")(validate_command)
app.command("train")(train_command)
app.command("prune")(prune_command)


def main() -> None:
    """Entry point of the ``tfshards`` console script."""
    app()
