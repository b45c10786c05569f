# The commands of the README: `make demo`, `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
BIND ?= 127.0.0.1:8443
CERTS_DIR ?= .certs
# make run serves without a cluster unless asked: `make run OVERSALE_KUBERNETES=auto` uses the
# in-cluster config or the kubeconfig's current context (and says which server at start).
OVERSALE_KUBERNETES ?= off

.PHONY: run demo test lint venv clean

$(BIN)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

venv: $(BIN)/.installed

## Install and serve the webhook locally over HTTPS (certificates created in .certs/).
run: venv
	OVERSALE_KUBERNETES=$(OVERSALE_KUBERNETES) $(BIN)/python -m webhook --bind $(BIND) --certs-dir $(CERTS_DIR)

## See compression and node overselling on four sample reviews, without a cluster.
demo: venv
	$(BIN)/python -m webhook.demo

## Lint, type-check and run the whole test suite, a test file to each core (TEST_WORKERS=0: in this process).
# A file's tests stay on one worker, so its module fixtures (a backfilled Prometheus) start once.
TEST_WORKERS ?= auto
test: venv lint
	$(BIN)/python -m pytest --numprocesses=$(TEST_WORKERS) --dist=loadfile

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .certs .pytest_cache .mypy_cache .ruff_cache .hypothesis
