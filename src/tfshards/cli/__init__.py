"""The ``tfshards`` command: one subcommand per pipeline stage.

Each subcommand is the same function the matching ``stages/*.py`` script runs,
so options are defined once. None of these modules imports TensorFlow at import
time, so ``tfshards --help`` answers at once.
"""

from __future__ import annotations

import importlib
import os
from typing import Annotated, Any

# numpy's OpenBLAS starts a thread per core that spins once numpy is imported, in every
# command, stage and pool worker: `python -c "import numpy"` took 0.17 s of CPU, 0.09 s
# with one BLAS thread, and a 20,000-file write 0.66-0.74 s of user CPU against 0.54-0.58
# s (2 cores). No command does matrix work worth a second thread; a user's setting wins.
# Set here, before a command module imports numpy; pool workers inherit it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import typer
import typer.core
import typer.main

from tfshards._version import __version__
from tfshards.cli._common import run_app

# Each subcommand, in pipeline order (sample -> list -> write -> validate -> train, then
# the tools), and the module and name of its function (or sub-app). A module is imported
# when its command runs or its help is shown, so `tfshards --version` and `tfshards list
# --help` pay for nothing else. Its ``CONTEXT``, if any, is the command's context settings.
COMMANDS = {
    "init": ("tfshards.cli.init", "init_command"),
    "sample": ("tfshards.cli.sample", "sample_app"),
    "list": ("tfshards.cli.list", "list_files_command"),
    "write": ("tfshards.cli.write", "write_command"),
    "validate": ("tfshards.cli.validate", "validate_command"),
    "train": ("tfshards.cli.train", "train_command"),
    "diff": ("tfshards.cli.diff", "diff_command"),
    "show": ("tfshards.cli.show", "show_command"),
    "prune": ("tfshards.cli.prune", "prune_command"),
    "doctor": ("tfshards.cli.doctor", "doctor_command"),
}


def load_command(name: str) -> Any:
    """The click command ``name`` names in :data:`COMMANDS`, its module imported now."""
    module_name, attribute = COMMANDS[name]
    module = importlib.import_module(module_name)
    found = getattr(module, attribute)
    if isinstance(found, typer.Typer):
        command = typer.main.get_command(found)
    else:
        single = typer.Typer(add_completion=False, rich_markup_mode=None)
        single.command(name, context_settings=getattr(module, "CONTEXT", None))(found)
        command = typer.main.get_command(single)
    command.name = name
    return command


class LazyCommands(typer.core.TyperGroup):
    """The ``tfshards`` group: a command's module is imported only when that command is used."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            self.commands[cmd_name] = load_command(cmd_name)
        return self.commands.get(cmd_name)


app = typer.Typer(
    name="tfshards",
    cls=LazyCommands,
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


def main() -> None:
    """Entry point of the ``tfshards`` console script."""
    run_app(app)
