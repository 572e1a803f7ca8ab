"""The rehearsal of the paper DAG (`make rehearsal`): its config is derived from config/paper.yaml,
replacing only the models, the sizes and the resources, and plans the paper's jobs; its check
(`bfspo rehearsal-check`, the DAG's last rule) refuses an empty cell or a run without an optimizer
step. The full run is CI's third step (.ci/run), too long for `make test`."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import yaml

from bfspo.errors import BfspoError
from bfspo.io import write_jsonl
from bfspo.rehearsal.check import check
from bfspo.rehearsal.config import NOTE, TRAIN_SIZE, derive
from tests.test_workflow import ROOT, dry_run, job_counts, jobs

PAPER = yaml.safe_load((ROOT / "config/paper.yaml").read_text())


def test_derivation_is_pure_and_replaces_only_models_sizes_and_resources():
    before = copy.deepcopy(PAPER)
    rehearsal = derive(PAPER)
    assert PAPER == before  # the paper config is not touched
    for key in ("seeds", "slurm", "data", "reported_results", "train_sets", "benchmarks"):
        assert rehearsal[key] == PAPER[key], key
    # a method keeps its fields; the sizes in its own train block shrink to the rehearsal's
    assert rehearsal["methods"].keys() == PAPER["methods"].keys()
    for name, method in PAPER["methods"].items():
        own = method.get("train", {})
        assert rehearsal["methods"][name] == method | ({"train": own | {k: TRAIN_SIZE[k] for k in own.keys() & TRAIN_SIZE.keys()}}
                                                       if own else {}), name
    assert rehearsal["methods"]["bfspo"]["train"] == {"group_size": 4, "train_batch": 2, "mini_batch": 1}
    # its W&B runs go to a project of their own, tagged (issue 26)
    assert rehearsal["wandb"] == PAPER["wandb"] | {"project": PAPER["wandb"]["project"] + "-rehearsal",
                                                   "tags": ["rehearsal"]}
    for name, model in rehearsal["models"].items():
        size = PAPER["models"][name]["size"]
        assert model == PAPER["models"][name] | {"path": f"results/rehearsal/models/{size}"}
    assert rehearsal["stand_ins"] == {"dir": "results/rehearsal/models"} and rehearsal["results"] == "results/rehearsal"
    assert (rehearsal["benchmarks"]["aime25"]["samples"], rehearsal["benchmarks"]["aime25"]["temperature"]) == (32, 1.0)
    sizes = {"steps", "limit", "group_size", "train_batch", "mini_batch", "oversample", "max_gen_rounds", "threads",
             "val_questions"}
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


def test_rehearsal_plans_the_papers_jobs_plus_the_stand_ins_and_the_check(rehearsal_config):
    paper = job_counts(dry_run("--configfile", "config/paper.yaml"))
    out = dry_run("-p", "--rerun-incomplete", "--configfile", str(rehearsal_config))  # even beside a rehearsal running
    counts = job_counts(out)
    assert (counts["train"], counts["evaluate"]) == (paper["train"], paper["evaluate"]) == (15, 42)
    assert counts == paper + Counter(stand_in=2, stand_in_sft=2, rehearsal_check=1)
    big = [t for r, t in jobs(out) if r == "train" and "llama3.1-8b_math_bfspo_s0" in t]
    assert "torchrun --nproc-per-node 2 --standalone -m bfspo.cli train" in big[0] and "gpu=0" in big[0]
    (aime,) = [t for r, t in jobs(out) if r == "evaluate" and "qwen2.5-7b_math_dapo_s0/aime25" in t]
    assert "--samples 32 --temperature 1.0" in aime and "--budget 1024" in aime
    assert "--model results/rehearsal/models/8b" in aime
    # every W&B run of the rehearsal goes to its own project, tagged (issue 26)
    tag = {"train": 'wandb_tags=["rehearsal"]', "evaluate": "--wandb-tags rehearsal", "report": "--wandb-tags rehearsal"}
    logged = [(r, t) for r, t in jobs(out) if r in tag]
    assert {r for r, _ in logged} == set(tag) and all("bfspo-rehearsal" in t and tag[r] in t for r, t in logged)


def _table(tmp_path, name, acc, title=f"T [{NOTE}]"):
    rows = [("Zero-shot", "paper", "acc", 80.0), ("Zero-shot", "ours", "acc", 1.0), ("Zero-shot", "ours", "avg_len", 12.0),
            ("DAPO", "ours", "acc", acc), ("DAPO", "ours", "avg_len", 9.5), ("DAPO", "ours", "aes", None)]
    pd.DataFrame([dict(Method=m, Source=src, train_set="gsm8k", benchmark="gsm8k", metric=met, mean=v, std=None,
                       ci_low=None, ci_high=None, n_seeds=1) for m, src, met, v in rows]).to_csv(tmp_path / f"{name}.csv", index=False)
    (tmp_path / f"{name}.md").write_text(f"## {title}\n\n| Method |\n")
    return tmp_path / f"{name}.csv"


def _run(tmp_path, name, steps):
    (tmp_path / name).mkdir()
    rows = [{"step": 1, "train/optimizer_steps": steps, "rollout/groups_kept": steps, "rollout/groups_filtered": 3}]
    write_jsonl(tmp_path / name / "metrics.jsonl", rows)
    return tmp_path / name


def test_check_passes_a_complete_rehearsal_and_counts_its_mixed_groups(tmp_path):
    result = check([_table(tmp_path, "gsm8k", 2.5)], [_run(tmp_path, "a", 1), _run(tmp_path, "b", 2)])
    assert result["cells_of_ours"] == {"gsm8k": 4} and result["optimizer_steps_min"] == 1
    assert (result["groups_mixed"], result["groups_generated"]) == (3, 9) and result["note"] == NOTE


def test_check_names_every_empty_cell_unmarked_title_and_run_without_a_step(tmp_path):
    tables = [_table(tmp_path, "gsm8k", None), _table(tmp_path, "math", 3.0, title="Table 3")]
    with pytest.raises(BfspoError) as e:
        check(tables + [tmp_path / "ablation.csv"], [_run(tmp_path, "a", 0), _run(tmp_path, "b", 1)])
    message = str(e.value)
    assert "gsm8k.csv: row DAPO, ours, gsm8k, gsm8k: acc is nan, not a number" in message
    assert "math.md: its title does not say" in message and "ablation.csv: missing" in message
    assert f"{tmp_path / 'a'}: no optimizer step" in message and f"{tmp_path / 'b'}:" not in message
