# Two commands do all set-up on a fresh machine (Python 3.10+ and pip are enough):
#   make demo   create .venv, install, run the whole DVC pipeline on the bundled sample
#   make test   create .venv, install, lint, type-check and run every test
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
UV_VERSION := 0.13.9

export DVC_NO_ANALYTICS := true
export DVC_NO_UPDATE_CHECK := true
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: install demo test test-fast lint deps bench dist lock clean

install: $(BIN)/.installed

# The lock file is resolved in one pass (s3fs/aiobotocore/botocore/moto pin each
# other tightly), so nothing installed later can upgrade one of them by accident.
# --compile-bytecode: uv installs .py files only, and where PYTHONDONTWRITEBYTECODE is set
# nothing writes the .pyc later, so every process compiled what it imported: importing
# TensorFlow cost 16.9 s of CPU instead of 6.2 s (2 busy cores), in each stage and test.
$(BIN)/.installed: pyproject.toml setup.py src/tfshards/_version.py $(wildcard src/tfshards/format/_native*.[ch]) \
		requirements/lock.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -r requirements/lock.txt
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps -e .
	touch $@

demo: install
	test -d .git || git init --quiet
	test -d .dvc || $(BIN)/dvc init --quiet
	$(BIN)/dvc config core.analytics false
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/dvc repro
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m tfshards.summary

lint: install
	$(BIN)/ruff check src stages tests bench
	$(BIN)/ruff format --check src stages tests bench
	$(BIN)/mypy

# loadfile: a test file's tests share one worker, so its module fixtures (a trained run, a
# reproduced pipeline, a built sdist) are made once, not once per worker.
test: lint
	$(BIN)/pytest -n 2 --dist loadfile --durations=15

test-fast: install
	$(BIN)/pytest -n 2 --dist loadfile -m "not slow"

# dvc.yaml: each stage's src/ deps become the modules its script imports (tests/test_stages.py).
deps: install
	$(BIN)/python tests/stagedeps.py --fix

bench: install
	$(BIN)/python -m bench.suite.run --out bench/results

# dist/: the sdist and a wheel that carries the compiled loops and the libcrypto they
# hash with (auditwheel copies it in and retags the wheel manylinux_2_X, X = the newest
# glibc symbol it or libcrypto needs), so it installs and runs without a compiler or
# OpenSSL on any Linux with that glibc. `python -m build` makes the sdist, then the
# wheel from it, so a file the sdist lacks fails here, not on a user's machine.
# DIST_PYTHONS: more interpreters to build a wheel for, from the same sdist, e.g.
#   make dist DIST_PYTHONS="$(echo ~/.pyenv/versions/3.1[023].*/bin/python3)"
DIST_PYTHONS ?=
dist: install
	rm -rf dist build/wheel
	TFSHARDS_REQUIRE_NATIVE=1 $(BIN)/python -m build --installer uv --outdir build/wheel .
	for py in $(DIST_PYTHONS); do TFSHARDS_REQUIRE_NATIVE=1 $(BIN)/uv build --quiet --wheel \
	  --python $$py --out-dir build/wheel build/wheel/*.tar.gz || exit 1; done
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/auditwheel repair --wheel-dir dist build/wheel/*.whl
	mv build/wheel/*.tar.gz dist/
	ls -l dist

# Refresh requirements/lock.txt after changing dependencies in pyproject.toml.
lock: install
	$(BIN)/uv pip compile pyproject.toml --extra cpu --extra s3 --extra dask --extra bench \
	  --extra dev --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	  -o requirements/lock.txt

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build dist
