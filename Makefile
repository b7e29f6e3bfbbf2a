# Two entry points (see README): `make train` runs the default recipe, `make test` runs the tests.
# Both create or refresh .venv first when pyproject.toml or the install script changed.
VENV ?= .venv
STAMP := $(VENV)/.relayrl-installed
ARGS ?=
PYTEST_ARGS ?=

.PHONY: install train test bench clean
install: $(STAMP)

$(STAMP): pyproject.toml scripts/install.sh
	bash scripts/install.sh $(VENV)
	touch $(STAMP)

train: $(STAMP)
	$(VENV)/bin/relayrl train --config-name grpo_arith $(ARGS)

test: $(STAMP)
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
