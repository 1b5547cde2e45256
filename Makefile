# Two commands set up and use a fresh machine:
#   make run   - create .venv, install gpubench with the CUDA extra, run `gpubench copy --pinned`
#   make test  - create .venv if missing, install the test extras, run the whole test suite
# CUDA=cuda12 picks CuPy for CUDA 12. The ucx extra (distributed-ucxx, for `merge -p ucx` tests)
# exists for CUDA 13 only, so it is installed with cuda13 alone.
PYTHON ?= python3
VENV ?= .venv
CUDA ?= cuda13
BIN := $(VENV)/bin
ifeq ($(CUDA),cuda13)
TEST_EXTRAS := $(CUDA),test,ucx
else
TEST_EXTRAS := $(CUDA),test
endif

.PHONY: run test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.run-$(CUDA): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e ".[$(CUDA)]"
	touch $@

$(VENV)/.test-$(CUDA): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e ".[$(TEST_EXTRAS)]"
	touch $@

run: $(VENV)/.run-$(CUDA)
	$(BIN)/gpubench copy --pinned

test: $(VENV)/.test-$(CUDA)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) build src/*.egg-info
