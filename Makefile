# Two entry points (see README): `make train` runs the default recipe, `make test` runs every test that
# CI runs (the fast suite and the `slow` lane: chaos, resume, learning runs); `make test-fast` skips `slow`.
# Both create or refresh .venv first when pyproject.toml or the install script changed.
VENV ?= .venv
STAMP := $(VENV)/.relayrl-installed
ARGS ?=
PYTEST_ARGS ?=

.PHONY: install train test test-fast clean
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

clean:
	rm -rf $(VENV) .pytest_cache
