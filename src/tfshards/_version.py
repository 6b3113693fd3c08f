"""The tfshards version, in one place.

setuptools reads it for the distribution's metadata (pyproject.toml,
``[tool.setuptools.dynamic]``); ``tfshards.__version__``, ``tfshards --version``,
the ``--pipeline-version`` pin that ``tfshards init`` writes into dvc.yaml, and
the version a dask worker must match all import it from here. It is a plain
assignment, so setuptools reads it without importing the package.
"""

__version__ = "0.2.0"
