"""The rehearsal of the paper DAG (`make rehearsal`): its config is derived from config/paper.yaml,
replacing only the models, the sizes and the resources, and plans the paper's jobs."""

from __future__ import annotations

import copy
import os
import re
from collections import Counter
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from bfspo.errors import BfspoError
from bfspo.rehearsal.config import NOTE, derive
from tests.test_workflow import ROOT, dry_run, job_counts, jobs, workflow_copy

PAPER = yaml.safe_load((ROOT / "config/paper.yaml").read_text())


def test_derivation_is_pure_and_replaces_only_models_sizes_and_resources():
    before = copy.deepcopy(PAPER)
    rehearsal = derive(PAPER)
    assert PAPER == before  # the paper config is not touched
    for key in ("seeds", "wandb", "slurm", "data", "reported_results", "train_sets", "benchmarks", "methods"):
        assert rehearsal[key] == PAPER[key], key
    for name, model in rehearsal["models"].items():
        size = PAPER["models"][name]["size"]
        assert model == PAPER["models"][name] | {"path": f"results/rehearsal/models/{size}"}
    assert rehearsal["stand_ins"] == {"dir": "results/rehearsal/models"} and rehearsal["results"] == "results/rehearsal"
    assert (rehearsal["benchmarks"]["aime25"]["samples"], rehearsal["benchmarks"]["aime25"]["temperature"]) == (32, 1.0)
    sizes = {"steps", "limit", "group_size", "train_batch", "mini_batch", "oversample", "max_gen_rounds", "threads"}
    assert {k: v for k, v in rehearsal["train"].items() if k not in sizes} == {
        k: v for k, v in PAPER["train"].items() if k not in sizes}
    assert rehearsal["train"]["engine"] == rehearsal["evaluation"]["engine"] == "vllm"
    assert rehearsal["evaluation"] == PAPER["evaluation"] | {"limit": rehearsal["evaluation"]["limit"]}
    for name, spec in rehearsal["tables"].items():
        assert spec == PAPER["tables"][name] | {"title": f"{PAPER['tables'][name]['title']} [{NOTE}]"}
    # every class runs on CPU; the 2-GPU class keeps its 2 ranks, data-parallel
    assert all(res["gpus"] == 0 for res in rehearsal["resources"].values())
    assert rehearsal["resources"]["8b"]["ranks"] == PAPER["resources"]["8b"]["gpus"] == 2
    assert "ranks" not in rehearsal["resources"]["3b"]


def test_engine_can_be_swapped_and_nothing_else_with_it():
    fast, paper_engine = derive(PAPER, "transformers"), derive(PAPER)
    assert fast["train"]["engine"] == fast["evaluation"]["engine"] == "transformers"
    for cfg in (fast, paper_engine):
        for section in ("train", "evaluation"):
            cfg[section].pop("engine")
    assert fast == paper_engine
    with pytest.raises(BfspoError, match="engine must be"):
        derive(PAPER, "sglang")


def test_toy_configs_are_refused():
    with pytest.raises(BfspoError, match="toy"):
        derive(yaml.safe_load((ROOT / "config/test.yaml").read_text()))


@pytest.fixture
def rehearsal_config(tmp_path) -> Path:
    path = tmp_path / "rehearsal.yaml"
    subprocess.run([sys.executable, "-m", "bfspo.cli", "rehearsal-config", "--out", str(path)], cwd=ROOT, check=True)
    assert (tmp_path / "README.md").read_text().startswith(f"# {NOTE}")
    return path


def test_rehearsal_plans_the_papers_jobs_plus_two_stand_in_steps_per_size_class(rehearsal_config):
    paper = job_counts(dry_run("--configfile", "config/paper.yaml"))
    out = dry_run("-p", "--rerun-incomplete", "--configfile", str(rehearsal_config))  # even beside a rehearsal running
    counts = job_counts(out)
    assert (counts["train"], counts["evaluate"]) == (paper["train"], paper["evaluate"]) == (15, 42)
    assert counts == paper + Counter(stand_in=2, stand_in_sft=2)
    big = [t for r, t in jobs(out) if r == "train" and "llama3.1-8b_math_bfspo_s0" in t]
    assert "torchrun --nproc-per-node 2 --standalone -m bfspo.cli train" in big[0] and "gpu=0" in big[0]
    (aime,) = [t for r, t in jobs(out) if r == "evaluate" and "qwen2.5-7b_math_dapo_s0/aime25" in t]
    assert "--samples 32 --temperature 1.0" in aime and "--budget 1024" in aime
    assert "--model results/rehearsal/models/8b" in aime


@pytest.mark.slow
@pytest.mark.skip(reason="a random-init stand-in never answers right, so every batch is filtered out and, since "
                  "d9a304a, a run without an optimizer step is an error: the stand-ins need informative groups")
def test_rehearsal_fills_every_cell_of_every_paper_table(tmp_path):
    """`make rehearsal REHEARSAL_ENGINE=transformers` in a fresh copy: the paper's DAG end to end on
    tiny stand-ins, from `bfspo prepare` to the reports (10 min on a shared 2-core machine)."""
    env = workflow_copy(tmp_path)
    (tmp_path / "data/raw").symlink_to(ROOT / "data/raw")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    subprocess.run([sys.executable, "-m", "bfspo.cli", "rehearsal-config", "--engine", "transformers"],
                   cwd=tmp_path, env=env, check=True)
    run = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile",
                          "results/rehearsal/config.yaml"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=3600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    for table in PAPER["tables"]:
        assert_cells_filled(tmp_path / f"results/rehearsal/tables/{table}.csv")


def assert_cells_filled(path: Path) -> None:
    """Every accuracy and length cell of every row of ours holds a number."""
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    ours = table[table["Source"] == "ours"]
    cells = [c for c in table.columns if c.endswith(("Acc.", "Len."))]
    assert len(ours) and cells, path
    for col in cells:
        assert all(re.fullmatch(r"-?\d+(\.\d+)?", v) for v in ours[col]), (path, col, ours[col].tolist())
