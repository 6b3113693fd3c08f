"""DVC stage ``train``: validated shards -> models/model.keras + results/train/ (metrics, dvclive).

Same options as ``tfshards train``; run ``python stages/train.py --help``.
"""

from tfshards.cli._common import run_command
from tfshards.cli.train import CONTEXT, train_command

if __name__ == "__main__":
    # Extra arguments (after `--`) go to a package.module:function model.
    run_command(train_command, CONTEXT)
