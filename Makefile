# ablate — every target sets itself up: a fresh clone needs only `make run` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.setup-stamp
PORT ?= 5000
NOTEBOOK_PORT ?= 8888
ARGS ?=

# Developers and CI: the data folder beside the checkout; `make setup` points conf/local/ at it.
SHARED_DATA := $(abspath ../shared/data)
LOCAL := conf/local/default.yaml
export MLFLOW_DISABLE_TELEMETRY ?= true
TRACKING_URI = $${MLFLOW_TRACKING_URI:-sqlite:///$(CURDIR)/mlflow.db}

.PHONY: help setup run test test-fast lint format sweep lr-study report notebook bench contention bench-gpu gpu-wheels ui server server-stop member password clean distclean

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

# torch first and pinned (PyPI's Linux wheel is a CUDA build of GBs; here pip finds a local CPU
# wheel). TORCH_INDEX names the wheel index: by default pip's own, or where nvidia-smi answers
# CUDA's (TORCH_CUDA_INDEX: pick the CUDA your driver runs); TORCH_INDEX=<url> for any other.
TORCH := torch==2.13.0
TORCH_CUDA_INDEX ?= https://download.pytorch.org/whl/cu128
TORCH_INDEX ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo $(TORCH_CUDA_INDEX))

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e '.[dev]'
	@$(PY) -c 'import torch; print("torch", torch.__version__, "CUDA:", torch.cuda.is_available())'
	touch $(STAMP)

$(LOCAL):
	@if [ -d "$(SHARED_DATA)/ud" ]; then mkdir -p $(dir $(LOCAL)) && \
	  printf '# @package _global_\n# This machine'"'"'s settings (git-ignored), written by make setup.\ndata:\n  root: $${oc.env:ABLATE_DATA_DIR,%s}\n' \
	  "$(SHARED_DATA)" > $(LOCAL) && echo "wrote $(LOCAL): data.root=$(SHARED_DATA)"; fi

setup: $(STAMP) $(LOCAL) ## create .venv (ablate, dev tools) and, when a data folder sits beside the checkout, conf/local/

run: setup ## a real short training run (Naija, MiniLM, 300 sentences, 1 epoch), tracked in MLflow
	$(PY) -m ablate.train experiment=smoke $(ARGS)

test: setup ## the whole test suite (offline)
	HF_HUB_OFFLINE=1 $(PY) -m pytest $(ARGS)

test-fast: setup ## the suite without the tests that start processes (the CLI, servers, sweeps)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -m "not process" $(ARGS)

lint: $(STAMP) ## ruff check and format check
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(STAMP) ## apply ruff's fixes and formatting
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

sweep: $(STAMP) ## the earlier study's grid: 5 freeze options x naija,ewt
	$(PY) -m ablate.train --multirun experiment=study $(ARGS)

LR_FREEZE ?= none,lora,bitfit,llrd,gradual,embeddings
lr-study: $(STAMP) ## a fair lr per freeze option (one resumable Optuna study each), then the best-lr table
	$(PY) -m ablate.lrstudy freeze=$(LR_FREEZE) $(ARGS)

bench: $(STAMP) ## ablate vs the plain HF Trainer recipe on this CPU: reports/bench/ and MLflow
	$(PY) benchmarks/bench.py --uri "$(TRACKING_URI)" $(ARGS)

contention: $(STAMP) ## a run alone and beside a busy job, per OpenMP wait policy, on this CPU
	$(PY) benchmarks/contention.py --uri "$(TRACKING_URI)" $(ARGS)

# The GPU bench (docs/speed.md). A lent GPU machine has no network: `make gpu-wheels` (here)
# fills $(GPU_ASSETS) with what it lacks; `make bench-gpu` there installs it and runs the bench
# in its python3 (a checkout's .venv where there is one).
GPU_ASSETS ?= .gpu-bench
GPU_PY = $(if $(wildcard $(STAMP)),$(PY),python3)

gpu-wheels: $(STAMP) ## wheels, data and tokenizers for make bench-gpu on a GPU machine, into .gpu-bench/
	HF_HUB_OFFLINE=1 $(PY) benchmarks/gpu_assets.py fill $(GPU_ASSETS) $(ARGS)

bench-gpu: ## ablate vs the plain recipe on a GPU in 9 minutes: reports/bench-gpu/
	@if [ -d $(GPU_ASSETS)/wheels ]; then $(GPU_PY) benchmarks/gpu_assets.py install $(GPU_ASSETS); fi
	PYTHONPATH=$(CURDIR)/src HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 $(GPU_PY) benchmarks/bench_gpu.py --assets $(GPU_ASSETS) --out "$${OUT:-reports/bench-gpu}" $(ARGS)

report: $(STAMP) ## report of the latest sweep with runs into reports/ (ARGS="--all", "--sweep DIR", or "--sweep A --sweep B": side by side)
	$(PY) -m ablate.report --uri "$(TRACKING_URI)" $(ARGS)

# JupyterLab refuses to start as root (a container on a GPU server) without --allow-root.
notebook: $(STAMP) ## the report inline in JupyterLab (notebooks/compare.ipynb)
	@$(PY) -c "import jupyterlab" 2>/dev/null || $(PY) -m pip install -q -e '.[dev,notebook]'
	$(VENV)/bin/jupyter lab notebooks/compare.ipynb --ip 127.0.0.1 --port $(NOTEBOOK_PORT) $(if $(filter 0,$(shell id -u)),--allow-root) $(ARGS)

ui: $(STAMP) ## the MLflow UI on the same store (PORT=5000); prints each experiment's runs page
	$(PY) -m ablate.server.ui --uri "$(TRACKING_URI)" --host 127.0.0.1 --port $(PORT)

server: $(STAMP) ## team MLflow server, login, PostgreSQL, lr-study storage (HOST=0.0.0.0: network; DB_URL=...; PG_PORT=...; STUDY_PORT=...; UPLOAD_MB=1024)
	$(PY) -m ablate.server start --host "$(or $(HOST),127.0.0.1)" --port $(PORT) $(if $(DB_URL),--db-url "$(DB_URL)") $(if $(PG_PORT),--pg-port "$(PG_PORT)") $(if $(STUDY_PORT),--study-port "$(STUDY_PORT)") $(if $(UPLOAD_MB),--max-upload-mb "$(UPLOAD_MB)")

server-stop: $(STAMP) ## stop what make server started (by pid)
	$(PY) -m ablate.server stop

member: $(STAMP) ## add a server member or change its role: NAME=alice ROLE=reader|editor [EXPERIMENTS=a,b]
	$(PY) -m ablate.server member "$(NAME)" $(if $(ROLE),--role "$(ROLE)") $(if $(EXPERIMENTS),--experiments "$(EXPERIMENTS)")

password: $(STAMP) ## a new password for NAME (a member, or admin), into .server/
	$(PY) -m ablate.server password "$(NAME)"

clean: ## remove run outputs and caches (keeps mlflow.db and .venv)
	rm -rf outputs .pytest_cache .ruff_cache
	find multirun -mindepth 1 ! -name README.md -exec rm -rf {} +
	find . -name __pycache__ -not -path './$(VENV)/*' -exec rm -rf {} +

distclean: clean ## also remove the MLflow store and .venv
	rm -rf mlflow.db mlartifacts mlruns $(VENV)
