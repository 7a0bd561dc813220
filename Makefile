# The two commands of the README. Both do the set-up first (idempotent, see scripts/setup.sh).
.PHONY: chat test setup
ARGS ?=

chat: setup
	.venv/bin/specchat $(ARGS)

# the suite runs on every core (pytest-xdist, at most 4 workers: each test's torch and native
# kernels use threads of their own); JOBS=0 runs it in one process
JOBS ?= auto
test: setup
	.venv/bin/python -m pytest -n $(JOBS) --maxprocesses 4 $(ARGS)

setup:
	@bash scripts/setup.sh
