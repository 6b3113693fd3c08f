"""DVC stage ``list``: raw files under a root -> ``files.jsonl`` + ``meta.json``.

Same options as ``tfshards list``; run ``python stages/list_files.py --help``.
"""

from tfshards.cli._common import run_command
from tfshards.cli.list import list_files_command

if __name__ == "__main__":
    run_command(list_files_command)
