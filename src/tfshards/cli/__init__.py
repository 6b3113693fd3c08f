"""The ``tfshards`` command: one subcommand per pipeline stage.

Each subcommand is the same function the matching ``stages/*.py`` script runs,
so options are defined once. None of these modules imports TensorFlow at import
time, so ``tfshards --help`` answers at once.
"""

from __future__ import annotations

from typing import Annotated

import typer

from tfshards._version import __version__
from tfshards.cli._common import run_app
from tfshards.cli.diff import diff_command
from tfshards.cli.doctor import doctor_command
from tfshards.cli.init import init_command
from tfshards.cli.list import list_files_command
from tfshards.cli.prune import prune_command
from tfshards.cli.sample import sample_app
from tfshards.cli.train import CONTEXT, train_command
from tfshards.cli.validate import validate_command
from tfshards.cli.write import CONTEXT as WRITE_CONTEXT
from tfshards.cli.write import write_command

app = typer.Typer(
    name="tfshards",
    help="Turn raw files into reproducible, validated TFRecord shards (DVC pipeline stages).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: rich's formatting costs ~0.4 s per --help
)


def _print_version(shown: bool) -> None:
    if shown:
        typer.echo(f"tfshards {__version__}")
        raise typer.Exit(0)


@app.callback()
def pin_version(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=lambda shown: _print_version(shown),
            help="Print the installed version and exit.",
        ),
    ] = False,
    pipeline_version: Annotated[
        str | None,
        typer.Option(
            help="Stop unless the installed tfshards is this version. `tfshards init` writes it "
            "into each stage's command, so an upgrade goes through `tfshards init --force` "
            "and DVC re-runs the stages.",
        ),
    ] = None,
) -> None:
    if pipeline_version is not None and pipeline_version != __version__:
        typer.echo(
            f"error: dvc.yaml's stages were written for tfshards {pipeline_version}, "
            f"this is tfshards {__version__}: install tfshards=={pipeline_version}, or run "
            "`tfshards init --force` to move the pipeline to this version (its stages re-run)",
            err=True,
        )
        raise typer.Exit(1)


app.command("init")(init_command)
# In pipeline order: sample -> list -> write -> validate -> train.
app.add_typer(sample_app, name="sample")
app.command("list")(list_files_command)
app.command("write", context_settings=WRITE_CONTEXT)(write_command)
app.command("validate")(validate_command)
app.command("train", context_settings=CONTEXT)(train_command)
app.command("diff")(diff_command)
app.command("prune")(prune_command)
app.command("doctor")(doctor_command)


def main() -> None:
    """Entry point of the ``tfshards`` console script."""
    run_app(app)
