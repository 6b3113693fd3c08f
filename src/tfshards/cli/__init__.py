"""The ``tfshards`` command: one subcommand per pipeline stage.

Each subcommand is the same function the matching ``stages/*.py`` script runs,
so options are defined once.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="tfshards",
    help="Turn raw files into reproducible, validated TFRecord shards (DVC pipeline stages).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def main() -> None:
    """Entry point of the ``tfshards`` console script."""
    app()
