# maskrcnn-dist: the front door. `make demo` and `make test` are all a fresh machine needs.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Everything the demo writes; removed by `make clean`.
DEMO_DIR ?= runs/demo

.PHONY: help install demo test test-fast test-soak gpu-check-cpu test-budget gpu-check lint docs clean

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

# The stamp depends on the package definitions, so editing a dependency re-installs and a second
# `make install` with nothing changed does nothing.
$(STAMP): pyproject.toml launcher/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ./launcher -e '.[dev,k8s,export]'
	touch $(STAMP)

install: $(STAMP) ## create .venv and install the trainer, the launcher and the test tools (idempotent)

demo: install ## train Mask R-CNN on a generated synthetic COCO set on CPU, evaluate, draw the report and a prediction gallery
	$(BIN)/maskrcnn-dist demo --output-dir $(DEMO_DIR)

# Each test's wall and CPU seconds (tests/timings.py): `make test-budget` holds them against the
# committed baseline, `python tests/hack/timings.py report runs/test-timings.json` prints them per folder.
TEST_TIMINGS ?= runs/test-timings.json
# pytest-xdist workers: a whole file each (its module fixtures shared), the longest files first
# (tests/longest_first.py). Two on 2 cores: most slow tests wait on their processes (docs/testing.md).
TEST_WORKERS ?= 2
XDIST = $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# .ci/run sets it empty: the soak and the GPU check's rehearsal then share the workers with the rest.
TEST_MARKS ?= not soak and not rehearsal

test: install ## run the whole test suite but the soak and the gpu-check rehearsal (two xdist workers); writes $(TEST_TIMINGS)
	$(BIN)/python -m pytest -q $(XDIST) -m '$(TEST_MARKS)' tests --timings $(TEST_TIMINGS)

test-fast: install ## the quick loop: no test that trains or starts a process (within 3 minutes)
	$(BIN)/python -m pytest -q $(XDIST) -m 'not slow and not soak'

test-soak: install ## the long fault runs (the elastic chaos test: repeated kills and rejoins); .ci/run runs it
	$(BIN)/python -m pytest -q -m soak

gpu-check-cpu: install ## make gpu-check's every check on this CPU, as its self-test (about 3 minutes); .ci/run runs it
	$(BIN)/python -m pytest -q -m rehearsal tests/checks

test-budget: ## fail when the last `make test` added more test time than a change may (tests/hack/timings.py)
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) tests/hack/timings.py check $(TEST_TIMINGS)

# On a GPU machine, from a fresh copy. A $(PYTHON) that already has torch with CUDA (an NGC image, a
# cloud image) runs the check with this checkout on its path and installs nothing: the pinned torch is a
# multi-GB download that such a machine may not reach. Otherwise `install` first. Either way the checks
# take at most GPU_CHECK_BUDGET seconds (8 minutes by default: a 15-minute GPU lease fits a rerun).
GPU_CHECK_JSON   ?= runs/gpu-check/gpu_check.json
GPU_CHECK_BUDGET ?= 480
GPU_CHECK_ARGS   ?=
GPU_CHECK_RUN     = -m checks.gpu --device cuda --json-out $(GPU_CHECK_JSON) --time-budget $(GPU_CHECK_BUDGET) $(GPU_CHECK_ARGS)
gpu-check: ## prove the GPU paths (throughput vs torchvision, pipeline device maps, amp, ddp, checkpoints); table + JSON
	@if $(PYTHON) -c 'import sys, torch, torchvision; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then \
	    echo "gpu-check: $(PYTHON) has torch with CUDA: running this checkout with it (nothing installed)"; \
	    PYTHONPATH="$(CURDIR)/src:$(CURDIR)/launcher$${PYTHONPATH:+:$$PYTHONPATH}" $(PYTHON) -m checks.gpu.preflight && \
	    PYTHONPATH="$(CURDIR)/src:$(CURDIR)/launcher$${PYTHONPATH:+:$$PYTHONPATH}" $(PYTHON) $(GPU_CHECK_RUN); \
	else \
	    $(MAKE) --no-print-directory install && $(BIN)/python $(GPU_CHECK_RUN); \
	fi

lint: install lint-deploy ## ruff over the Python sources, hadolint, helm lint
	$(BIN)/ruff check src launcher checks tests benchmarks helm/hack docs/hack e2e
	$(BIN)/ruff format --check src launcher checks tests benchmarks helm/hack docs/hack e2e

# Reads this checkout's sources (click and PyYAML only, no torch): needs an installed .venv, never
# installs anything itself; tests/test_docs.py fails while the page is stale.
docs: ## regenerate docs/reference/flags.md from the config tables and the click commands
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) docs/hack/flags_page.py

include mk/deploy.mk
include mk/e2e.mk

clean: ## remove the virtual environment and demo outputs
	rm -rf $(VENV) runs
