"""Build the optional C loops (``tfshards.format._native``); everything else is in pyproject.toml.

The extension is optional: without a C compiler or OpenSSL's headers the
build goes on and :mod:`tfshards.format.native` uses the pure-Python loops
(the command line says so once per run). ``TFSHARDS_REQUIRE_NATIVE=1`` makes a
failed build an error instead: ``make dist`` sets it, so a wheel never ships
without the loops.
"""

import os

from setuptools import Extension, setup

# One C file per job; _native.c holds the module table (its comment lists the rest).
SOURCES = [
    f"src/tfshards/format/_native{part}.c"
    for part in ("", "_crc32c", "_frame", "_scan", "_parse", "_files", "_imagehead", "_members")
]
HEADERS = ["src/tfshards/format/_native.h", "src/tfshards/format/_native_crc32c.h"]

setup(
    ext_modules=[
        Extension(
            "tfshards.format._native",
            sources=SOURCES,
            depends=HEADERS,  # a changed header rebuilds every file, and the sdist carries them
            libraries=["crypto"],
            extra_compile_args=[
                "-O2",
                "-std=c11",
                "-Wall",
                "-Wextra",
                "-Wno-unused-parameter",
                "-fvisibility=hidden",  # one exported symbol: PyInit__native
            ],
            optional=os.environ.get("TFSHARDS_REQUIRE_NATIVE", "") in ("", "0"),
        )
    ]
)
