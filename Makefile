# The two commands of the README:  `make toy` (the main job) and `make test` (the tests).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORES ?= 2

.PHONY: setup toy test paper-dry-run lint clean

$(BIN)/bfspo: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

setup: $(BIN)/bfspo

toy: setup
	$(BIN)/snakemake --cores $(CORES)

test: setup
	HF_HUB_OFFLINE=1 WANDB_MODE=disabled $(BIN)/python -m pytest -q

lint: setup
	$(BIN)/snakemake --lint

paper-dry-run: setup
	$(BIN)/snakemake --profile slurm -n --configfile config/paper.yaml

clean:
	rm -rf results/data results/toy results/runs results/eval results/tables results/figures logs benchmarks .snakemake
