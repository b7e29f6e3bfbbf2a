# Two entry points (see README): `make train` runs the default recipe, `make test` runs every test that
# CI runs (the fast suite and the `slow` lane: chaos, resume, learning runs); `make test-fast` skips `slow`.
# `make lint` runs ruff (lint, format check) and mypy as configured in pyproject.toml; `make fix` applies
# ruff's safe fixes and the formatter. All create or refresh .venv first when pyproject.toml or the install
# script changed.
VENV ?= .venv
STAMP := $(VENV)/.relayrl-installed
ARGS ?=
PYTEST_ARGS ?=
LINT_PATHS := relayrl tests bench

.PHONY: install train test test-fast gpu-check lint fix clean
install: $(STAMP)

$(STAMP): pyproject.toml scripts/install.sh
	bash scripts/install.sh $(VENV)
	touch $(STAMP)

train: $(STAMP)
	$(VENV)/bin/relayrl train --config-name grpo_arith $(ARGS)

# -m "" lifts pyproject's default `-m 'not slow'`: every test, slow ones included (`gpu` ones skip on CPU).
test: $(STAMP)
	$(VENV)/bin/python -m pytest -m "" $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

# On a CUDA box, from bare: the install, every `gpu` test, the colocated sync against its floor and a short
# train, as one table (scripts/gpu_check.sh; logs in gpu-check-logs/).
gpu-check:
	bash scripts/gpu_check.sh

# All three run even when one fails, so one CI log shows everything; mypy's paths are `files` in pyproject.
lint: $(STAMP)
	@rc=0; \
	$(VENV)/bin/ruff check $(LINT_PATHS) || rc=1; \
	$(VENV)/bin/ruff format --check $(LINT_PATHS) || rc=1; \
	$(VENV)/bin/mypy || rc=1; \
	exit $$rc

fix: $(STAMP)
	-$(VENV)/bin/ruff check --fix $(LINT_PATHS)
	$(VENV)/bin/ruff format $(LINT_PATHS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
