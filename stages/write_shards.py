"""DVC stage ``write``: the listing -> versioned TFRecord shards + manifest.

Same options as ``tfshards write``; run ``python stages/write_shards.py --help``.
"""

from tfshards.cli._common import run_command
from tfshards.cli.write import CONTEXT, write_command

if __name__ == "__main__":
    # Options spelled as params.yaml keys (--num_shards) too: DVC passes ${write} so.
    run_command(write_command, CONTEXT)
