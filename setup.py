"""Build the optional C loops (``tfshards.format._native``); everything else is in pyproject.toml.

The extension is optional: without a C compiler or OpenSSL's headers the
build goes on and :mod:`tfshards.format.native` uses the pure-Python loops
(the command line says so once per run). ``TFSHARDS_REQUIRE_NATIVE=1`` makes a
failed build an error instead: ``make dist`` sets it, so a wheel never ships
without the loops.
"""

import os

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tfshards.format._native",
            sources=["src/tfshards/format/_native.c"],
            libraries=["crypto"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=os.environ.get("TFSHARDS_REQUIRE_NATIVE", "") in ("", "0"),
        )
    ]
)
