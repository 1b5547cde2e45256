# Two commands set up and use a fresh machine:
#   make run   - create .venv, install gpubench with the CUDA extra, run `gpubench copy --pinned`
#   make test  - create .venv if missing, install the test extras, run the whole test suite
# and one checks the source and the package (no GPU, a few minutes; .ci/run runs it before make test):
#   make check - ruff, mypy, lint-imports (make lint); python -m build, twine check --strict, what the
#                sdist and wheel hold, and the wheel on a base install in a fresh venv (make package)
# make browser installs headless Chromium from the system's packages when it is missing (Debian:
# apt-get install chromium; root, or sudo), for the HTML report's browser test; .ci/run does it first.
# CUDA=cuda12 picks CuPy for CUDA 12. The tests also get distributed-ucxx for that CUDA (ucx-cu13 or
# ucx-cu12), which pins dask to the version dask-cuda pins, so both CUDA majors test the same dask.
PYTHON ?= python3
VENV ?= .venv
CUDA ?= cuda13
BIN := $(VENV)/bin
ifeq ($(CUDA),cuda13)
TEST_EXTRAS := cuda13,test,ucx-cu13
else ifeq ($(CUDA),cuda12)
TEST_EXTRAS := cuda12,test,ucx-cu12
else
$(error CUDA=$(CUDA) is not known: use CUDA=cuda13 or CUDA=cuda12)
endif

.PHONY: manifests run test check lint lint-ruff lint-mypy lint-imports package clean browser schema

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.run-$(CUDA): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e ".[$(CUDA)]"
	touch $@

$(VENV)/.test-$(CUDA): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e ".[$(TEST_EXTRAS)]"
	touch $@

# make check's tools, pyproject.toml's [dependency-groups] check (pip install --group: pip >= 25.1)
$(VENV)/.check: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q --upgrade "pip>=25.1"
	$(BIN)/python -m pip install -q -e . --group check
	touch $@

run: $(VENV)/.run-$(CUDA)
	$(BIN)/gpubench copy --pinned

# The suite runs on 4 pytest-xdist workers (on 2 cores too: many tests wait on the processes they
# start); the 20 slowest tests are listed at the end. Bytecode is cached even where the environment
# says not to (PYTHONDONTWRITEBYTECODE): the suite starts hundreds of gpubench processes, each of
# which would compile its modules again, and every worker would rewrite every test module.
test: $(VENV)/.test-$(CUDA)
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -n 4 --dist worksteal --durations=20

check: lint package manifests

lint: lint-ruff lint-mypy lint-imports

# examples/kubernetes/ against Kubernetes' schemas (the MPIJob's own fields against its CRD's)
manifests: $(VENV)/.check
	$(BIN)/python ci/check_kubernetes.py

lint-ruff: $(VENV)/.check
	$(BIN)/ruff check src tests benchmarks examples ci

lint-mypy: $(VENV)/.check
	$(BIN)/mypy

# the layers of docs/architecture.md (pyproject.toml [tool.importlinter])
lint-imports: $(VENV)/.check
	$(BIN)/lint-imports

package: $(VENV)/.check
	rm -rf dist
	$(BIN)/python -m build --sdist --wheel --outdir dist/ .
	$(BIN)/twine check --strict dist/*
	$(BIN)/python ci/check_dists.py dist/
	PYTHON=$(PYTHON) ci/base_install_check.sh dist/*.whl

browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then \
		echo "chromium: $$(command -v chromium || command -v chromium-browser)"; \
	else \
		SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; \
		chromium --version; \
	fi

# the params entries of the published result schema, from gpubench's own plug-ins (after editing one)
schema: $(VENV)/.test-$(CUDA)
	$(BIN)/python ci/write_schema.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info
