# Two commands set up and use a fresh machine:
#   make run   - create .venv, install gpubench with the CUDA 13 extra, run `gpubench copy --pinned`
#   make test  - create .venv if missing, install the test extra, run the whole test suite
PYTHON ?= python3
VENV ?= .venv
CUDA ?= cuda13
BIN := $(VENV)/bin

.PHONY: run test venv clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed-$(CUDA): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e ".[$(CUDA),test,ucx]"
	touch $@

venv: $(VENV)/.installed-$(CUDA)

run: venv
	$(BIN)/gpubench copy --pinned

test: venv
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) build src/*.egg-info
