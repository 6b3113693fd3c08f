"""DVC stage ``write``: the listing -> versioned TFRecord shards + manifest.

Same options as ``tfshards write``; run ``python stages/write_shards.py --help``.
"""

import typer

from tfshards.cli.write import write_command

if __name__ == "__main__":
    typer.run(write_command)
