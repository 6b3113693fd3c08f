"""DVC stage ``sample``: materialize the bundled sample data set (no download).

Same commands as ``tfshards sample``: ``digits OUT_DIR`` or
``synthetic OUT_DIR --count N --size S``; run with ``--help`` for details.
"""

from tfshards.cli._common import run_app
from tfshards.cli.sample import sample_app

if __name__ == "__main__":
    run_app(sample_app)
