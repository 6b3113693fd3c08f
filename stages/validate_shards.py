"""DVC stage ``validate``: manifest + shards -> results/validate/metrics.json; exit 1 on a problem.

Same options as ``tfshards validate``; run ``python stages/validate_shards.py --help``.
"""

import typer

from tfshards.cli.validate import validate_command

if __name__ == "__main__":
    typer.run(validate_command)
