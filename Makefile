# The two commands of the README. Both do the set-up first (idempotent, see scripts/setup.sh).
.PHONY: chat test setup
ARGS ?=

chat: setup
	.venv/bin/specchat $(ARGS)

test: setup
	.venv/bin/python -m pytest $(ARGS)

setup:
	@bash scripts/setup.sh
