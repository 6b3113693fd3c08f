"""DVC stage ``train``: validated shards -> models/model.keras + results/train/ (metrics, dvclive).

Same options as ``tfshards train``; run ``python stages/train.py --help``.
"""

import typer

from tfshards.cli.train import CONTEXT, train_command

if __name__ == "__main__":
    app = typer.Typer(add_completion=False)
    app.command(context_settings=CONTEXT)(train_command)
    app()
