# The README's two commands. Both set kernel_env up first (scripts/setup.sh: system tools,
# Python 3.12, .venv, torch, kernel_env); the set-up is skipped in about a second when
# pyproject.toml and the Python used have not changed and the extras asked for are installed.
#
#   make demo   kernel_env with its base dependencies (no extra), then the bundled example task
#               with its bundled solution: cuda on a GPU machine, cpp (on the CPU) elsewhere
#   make test   kernel_env with the test extras (pytest and every other extra's packages), then
#               the CPU test suite (GPU tests: .venv/bin/pytest -m gpu tests/gpu on a GPU machine)
#   make test-fast  the same set-up, then the fast part of that suite (no test marked slow): 5 to 6
#               minutes on a 2-core machine, for the edit-test loop (the test map: tests/README.md)

SHELL := /bin/bash
VENV ?= .venv
export VENV
# A GPU machine runs the cuda solution; any other machine the cpp one, on the CPU.
DEMO_LANGUAGE ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpp)
PYTEST_ARGS ?=

.PHONY: help setup setup-base demo test test-fast

help:
	@echo "make demo        set up (base), then run example/relu_add with its bundled $(DEMO_LANGUAGE) solution"
	@echo "make test        set up (test extras), then run the CPU test suite"
	@echo "make test-fast   set up (test extras), then the fast part of it: no slow test (5-6 minutes on 2 cores)"
	@echo "make setup       only the set-up, with the test extras (every extra and pytest)"
	@echo "make setup-base  only the set-up that make demo needs (kernel_env without extras)"

setup:
	@bash scripts/setup.sh test

setup-base:
	@bash scripts/setup.sh

demo: setup-base
	$(VENV)/bin/kernel-env run-task example/relu_add --language $(DEMO_LANGUAGE) \
		--solution examples/relu_add/solutions/$(DEMO_LANGUAGE)

test: setup
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

# The marker expression replaces pyproject.toml's `-m 'not gpu'`, so it names gpu again.
test-fast: setup
	$(VENV)/bin/python -m pytest -m "not slow and not gpu" $(PYTEST_ARGS)
