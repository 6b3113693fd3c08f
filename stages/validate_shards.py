"""DVC stage ``validate``: manifest + shards -> results/validate/metrics.json; exit 1 on a problem.

Same options as ``tfshards validate``; run ``python stages/validate_shards.py --help``.
"""

from tfshards.cli._common import run_command
from tfshards.cli.validate import validate_command

if __name__ == "__main__":
    run_command(validate_command)
