"""DVC stage ``train``: validated shards -> models/model.keras + results/train/ (metrics, dvclive).

Same options as ``tfshards train``; run ``python stages/train.py --help``.
"""

import typer

from tfshards.cli.train import train_command

if __name__ == "__main__":
    app = typer.Typer(add_completion=False)
    # Extra arguments (after `--`) go to a package.module:function model.
    app.command(context_settings={"allow_extra_args": True})(train_command)
    app()
