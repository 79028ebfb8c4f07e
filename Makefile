# maskrcnn-dist: the front door. `make demo` and `make test` are all a fresh machine needs.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Everything the demo writes; removed by `make clean`.
DEMO_DIR ?= runs/demo

.PHONY: help install demo test test-fast gpu-check lint docs clean

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

test: install ## run the whole test suite
	$(BIN)/python -m pytest -q

test-fast: install ## unit tests only (no multi-process runs)
	$(BIN)/python -m pytest -q -m 'not slow'

# On a GPU machine, from a fresh copy: installs first. The checks take at most GPU_CHECK_BUDGET seconds.
GPU_CHECK_JSON   ?= runs/gpu-check/gpu_check.json
GPU_CHECK_BUDGET ?= 600
gpu-check: install ## prove the GPU paths (amp, ddp, pipeline, checkpoints) and time them against torchvision's loop; table + JSON
	$(BIN)/python benchmarks/gpu_check.py --json-out $(GPU_CHECK_JSON) --time-budget $(GPU_CHECK_BUDGET)

lint: install lint-deploy ## ruff over the Python sources, hadolint, helm lint
	$(BIN)/ruff check src launcher tests benchmarks helm/hack docs/hack e2e
	$(BIN)/ruff format --check src launcher tests benchmarks helm/hack docs/hack e2e

# Reads this checkout's sources (click and PyYAML only, no torch): needs an installed .venv, never
# installs anything itself; tests/test_docs.py fails while the page is stale.
docs: ## regenerate docs/reference/flags.md from the config tables and the click commands
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) docs/hack/flags_page.py

include mk/deploy.mk
include mk/e2e.mk

clean: ## remove the virtual environment and demo outputs
	rm -rf $(VENV) runs
