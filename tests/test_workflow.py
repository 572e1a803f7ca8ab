"""The Snakemake workflow: lint, config validation, and the DAG that each config plans.

Dry runs use --forceall, so outputs already in results/ do not change the counts, and --nolock,
so they can run beside a real run in the same tree.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import yaml

from bfspo.algorithm.advantages import keep_tree
from bfspo.algorithm.tree import SearchTree
from bfspo.errors import BfspoError
from tests.helpers import process

ROOT = Path(__file__).resolve().parents[1]


def snakemake(*args: str, cwd: Path = ROOT, timeout: int = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return process.run([sys.executable, "-m", "snakemake", *args], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, **(env or {})})


def dry_run(*args: str) -> str:
    proc = snakemake("-n", "--forceall", "--nolock", *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def job_counts(output: str) -> Counter:
    """The 'Job stats' table of a dry run: rule -> number of jobs."""
    table = output.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    counts = Counter()
    for line in table.splitlines():
        m = re.fullmatch(r"(\w+)\s+(\d+)", line.strip())
        if m and m.group(1) != "total":
            counts[m.group(1)] = int(m.group(2))
    return counts


def jobs(output: str) -> list[tuple[str, str]]:
    """(rule, text) of every job of a dry run; the text holds its wildcards, resources and command."""
    chunks = re.split(r"^\[[^\]\n]+\]$", output, flags=re.M)
    return [(m.group(1), c) for c in chunks if (m := re.match(r"\s*(?:local)?rule (\w+):", c))]


@functools.cache
def training_commands(configfile: str) -> dict[str, str]:
    """Each train job of `configfile`'s dry run: its output folder -> its `train` command but the names
    that do not change what is trained (output folder, run name, method key, W&B group, tables)."""
    return {re.search(r"--output-dir (\S+)", t).group(1):
            re.sub(r" --(set (run_name|method_key|wandb_group)=\S+|set 'tables=[^']*'|output-dir \S+)", "",
                   re.search(r" train --output-dir .*? >>", t).group(0))
            for r, t in jobs(dry_run("-p", "--configfile", configfile)) if r == "train"}


def wildcards(output: str, rule: str) -> list[str]:
    return [re.search(r"wildcards: (.*)", text).group(1) for r, text in jobs(output) if r == rule]


def write_config(tmp_path: Path, base: str, edit, own_results: bool = False) -> Path:
    """A copy of config `base`, edited, in tmp_path. With own_results its results folder is tmp_path/results:
    a copy that writes the tables of `base` into `base`'s results folder is refused once `base` has
    built them there (bfspo/reporting/owner.py)."""
    cfg = yaml.safe_load((ROOT / base).read_text())
    edit(cfg)
    if own_results:
        cfg["results"] = str(tmp_path / "results")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


# ---- lint and validation ---------------------------------------------------------------------


@pytest.mark.parametrize("configfile", [None, "config/test.yaml", "config/paper.yaml", "config/toy-seeds.yaml",
                                        "config/toy-study.yaml", "config/toy-study-hard.yaml",
                                        "config/toy-breakdown.yaml", "config/toy-breakdown-hard.yaml",
                                        "config/toy-gpu.yaml"])
def test_lint_is_clean(configfile):
    proc = snakemake("--lint", *(["--configfile", configfile] if configfile else []))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Lints for" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "edit, named",
    [
        (lambda c: c.update(learning_rate=1e-3), "config.yaml: unknown key 'learning_rate'"),
        (lambda c: c["models"]["toy"].update(pth="x"), "models.toy: unknown key 'pth'; did you mean 'path'?"),
        (lambda c: c["train"].update(model="other"), "train: unknown key 'model'"),
        (lambda c: c["methods"]["bfspo"].update(selection="greedy"), "'greedy'"),
        (lambda c: c["wandb"].update(mode="sometimes"), "'sometimes'"),
        (lambda c: c.update(seeds=[]), "seeds"),
        (lambda c: c["tables"]["toy-ablation"]["methods"].append("bfspo-k9"), "unknown method 'bfspo-k9'"),
        (lambda c: c["models"]["toy"].update(size="huge"), "unknown size class 'huge'"),
        (lambda c: c["train"].update(batch_unit="tokens"), "'tokens'"),
        (lambda c: c["train"].update(overlong_window="verl"), "'verl'"),
        (lambda c: c["train_sets"]["toy"].update(benchmark="gsm9k"), "'gsm9k' is not one of"),
        (lambda c: c["benchmarks"].update(gsm9k=c["benchmarks"]["toy"]), "'gsm9k' is not one of"),
    ],
    ids=["unknown-key", "unknown-nested-key", "per-run-key-in-train", "bad-enum", "bad-mode", "no-seeds",
         "unknown-method", "unknown-size", "bad-batch-unit", "bad-overlong-window", "unknown-train-benchmark",
         "unknown-benchmark"],
)
def test_invalid_config_stops_naming_the_problem(tmp_path, edit, named):
    proc = snakemake("-n", "--nolock", "--configfile", str(write_config(tmp_path, "config/config.yaml", edit)))
    assert proc.returncode != 0
    assert named in proc.stdout + proc.stderr


@pytest.mark.parametrize("edit, named", [
    (lambda c: c.update(seed=c.pop("seeds")), "unknown key 'seed'; did you mean 'seeds'?"),
    (lambda c: c["train"].update(group_sise=4), "train: unknown key 'group_sise'; did you mean 'group_size'?"),
    (lambda c: c.setdefault("slurm", {}).update(qoss="high"), "slurm: unknown key 'qoss'; did you mean 'qos'?"),
], ids=["seed", "group_sise", "slurm-qoss"])
def test_a_schema_error_is_a_few_lines_with_a_suggestion(tmp_path, edit, named):
    """Issue 33: a misspelt key printed 959 (`seed`) and 129 (`group_sise`) lines, the whole schema and
    config after the one useful line; now the violation, its path and the closest key, and
    jsonschema's full report only with BFSPO_VERBOSE=1. Issue 37: after the user's file, not the
    workflow's (`WorkflowError in file ".../common.smk", line 30`), whose place only BFSPO_VERBOSE=1 shows."""
    path = write_config(tmp_path, "config/config.yaml", edit)
    proc = snakemake("-n", "--nolock", "--configfile", str(path))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and f"{path}: {named}" in out and "BFSPO_VERBOSE=1" in out
    assert "common.smk" not in out and "WorkflowError" not in out
    assert len(out.splitlines()) <= 8, out
    proc = snakemake("-n", "--nolock", "--configfile", str(path), env={"BFSPO_VERBOSE": "1"})
    verbose = proc.stdout + proc.stderr
    assert named in verbose and "jsonschema's report" in verbose and len(verbose.splitlines()) > 50
    assert 'WorkflowError in file "' in verbose and "common.smk" in verbose


def test_the_schemas_benchmarks_are_bfspos_registry():
    """The planner checks benchmark names without importing bfspo: its enum must be the registry."""
    from bfspo.tasks.benchmarks import BENCHMARKS

    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    assert schema["$defs"]["benchmark"]["enum"] == list(BENCHMARKS)


def test_the_schemas_tree_attentions_are_the_trainers():
    from bfspo.algorithm.attention_options import ATTENTIONS

    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    assert schema["$defs"]["train"]["properties"]["tree_attention"]["enum"] == list(ATTENTIONS)


def test_a_learning_rate_in_exponent_notation_is_a_number(tmp_path):
    """`lr: 1e-4` (YAML 1.1 reads a string) is accepted as the command line accepts it."""
    path = tmp_path / "config.yaml"
    text = (ROOT / "config/config.yaml").read_text()
    assert "\n  lr: 1.0e-3\n" in text
    path.write_text(text.replace("\n  lr: 1.0e-3\n", "\n  lr: 1e-4\n"))
    out = dry_run("-p", "--configfile", str(path))
    assert "lr=0.0001" in out


def test_schema_covers_the_trainer_config():
    """Every TrainConfig field is either a config key (`train`) or set per run by the workflow."""
    from bfspo.training.config import TrainConfig

    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    in_schema = set(schema["$defs"]["train"]["properties"])
    per_run = {"model", "train_data", "benchmark", "budget", "k", "selection", "advantage", "overlong", "seed",
               "tensor_parallel_size", "wandb_project", "wandb_group", "wandb_mode", "run_name", "method_key",
               "model_label", "tables", "wandb_tags", "val_data", "val_benchmark", "device"}
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert in_schema <= fields, in_schema - fields
    assert per_run <= fields, per_run - fields
    assert fields == in_schema | per_run, fields ^ (in_schema | per_run)


# ---- the paper's matrix ----------------------------------------------------------------------


def test_paper_config_plans_exactly_the_papers_experiments():
    """`snakemake --profile slurm -n --configfile config/paper.yaml`, as the README types it."""
    out = dry_run("--profile", "slurm", "--configfile", "config/paper.yaml")
    seeds = len(yaml.safe_load((ROOT / "config/paper.yaml").read_text())["seeds"])
    benchmarks_t3 = 5  # MATH-500, GSM8K, MMLU-STEM, AIME'25, Minerva

    # Training runs. Table 2: 3 models x (DAPO, BFS-PO) on GSM8K. Table 3: 2 models x (DAPO, BFS-PO)
    # on MATH. Table 1: Qwen2.5-3B on GSM8K with K=0..3, w/o BFS, global, w/o R_l: 7 runs, of which
    # K=0 (DAPO) and K=3 (BFS-PO) are Table 2's, so 5 more. The appendix tables reuse these runs.
    train = (3 * 2 + 2 * 2 + (7 - 2)) * seeds
    # Zero-shot, once per (model, benchmark): Table 2's 3 on GSM8K; Table 3's 2 models x 5
    # benchmarks, whose GSM8K pair is Table 2's (same model, benchmark and budget).
    zero_shot = 3 + 2 * benchmarks_t3 - 2
    # Every trained run on each benchmark of its table.
    evaluate = (3 * 2 * 1 + 2 * 2 * benchmarks_t3 + 5 * 1) * seeds
    tables = 6  # Tables 1, 2, 3 and the three appendix TokenSkip-ratio tables
    assert job_counts(out) == Counter(
        prepare=1, train=train, evaluate=zero_shot + evaluate,
        table=tables, figures=tables, report=tables, aes_consistency=1, all=1,
    )
    assert (train, zero_shot, evaluate) == (15, 11, 31)
    evals = [w for w in wildcards(out, "evaluate")]
    assert sum("_zero-shot," in w for w in evals) == zero_shot
    assert sum("_zero-shot," in w and "benchmark=gsm8k" in w.split(", ") for w in evals) == 3

    runs = {w.removeprefix("run=") for w in wildcards(out, "train")}
    t1 = {f"qwen2.5-3b_gsm8k_{m}_s0" for m in ("dapo", "bfspo-k1", "bfspo-k2", "bfspo", "no-bfs", "global-adv", "no-overlong")}
    t2 = {f"{m}_gsm8k_{x}_s0" for m in ("qwen2.5-3b", "llama3.1-8b", "qwen2.5-7b") for x in ("dapo", "bfspo")}
    t3 = {f"{m}_math_{x}_s0" for m in ("llama3.1-8b", "qwen2.5-7b") for x in ("dapo", "bfspo")}
    assert runs == t1 | t2 | t3


def test_paper_jobs_request_gpus_by_model_size():
    out = dry_run("-p", "results/runs/llama3.1-8b_math_bfspo_s0/done.json", "results/runs/qwen2.5-3b_gsm8k_dapo_s0/done.json",
                  "results/tables/gsm8k.csv", "--configfile", "config/paper.yaml")
    train = {re.search(r"wildcards: run=(\S+)", t).group(1): t for r, t in jobs(out) if r == "train"}
    big, small = train["llama3.1-8b_math_bfspo_s0"], train["qwen2.5-3b_gsm8k_dapo_s0"]
    assert "gpu=2" in big and "nodes=1" in big and "budget=1024" in big and "--set k=3" in big
    assert "torchrun --nproc-per-node 2 --signals-to-handle" in big and "--standalone -m bfspo.cli train" in big  # one rank per GPU
    assert "gpu=1" in small and "nodes=1" in small and "budget=512" in small and "--set k=0" in small
    assert "tensor_parallel_size=1" in big and "tensor_parallel_size=1" in small
    # one process in the job step that the rule starts under Slurm (bfspo/pipeline/jobs.py, train_launcher)
    assert re.search(r"^Shell command: mkdir -p \S+ && ln -sfn \S+ \S+ && \$\{SLURM_JOB_ID:\+srun [^}]+\} bfspo train "
                     r"--output-dir ", small, re.M)
    for run in (big, small):  # the plan's time limit, warning signal and checkpoint interval
        assert re.search(r"mpi=srun, tasks=2, slurm_extra=--signal=USR1@\d+", run) and "--set save_every=1" in run
    for run in (big, small):  # DAPO's recipe: 3x oversampled, up to 10 rounds, the first-samples filter
        for setting in ("batch_unit=prompts", "oversample=3.0", "max_gen_rounds=10", "overlong_window=paper",
                        "filter=first_samples"):
            assert f"--set {setting}" in run, setting
    # DAPO: 512 prompts of 16 answers, mini-batches of 32; BFS-PO the same 8192 and 512 chains in
    # prompts of 4 answers (config/README.md, "Batch sizes")
    for run, (g, batch, mini) in ((small, (16, 512, 32)), (big, (4, 2048, 128))):
        for setting in (f"group_size={g}", f"train_batch={batch}", f"mini_batch={mini}"):
            assert f"--set {setting}" in run, setting
    cpu_jobs = [t for r, t in jobs(out) if r in ("prepare", "table")]
    assert len(cpu_jobs) == 2 and not any("gpu=" in t for t in cpu_jobs)


def test_job_threads_reach_train_and_evaluate_as_torch_threads():
    """Snakemake's threads become torch threads: shared out among a training job's ranks (8B: 2 GPUs
    x 8 CPUs, 2 ranks of 8), whole for an evaluation; the CPU configs' one thread per job."""
    out = dry_run("-p", "--cores", "64", "results/runs/llama3.1-8b_math_bfspo_s0/done.json",
                  "results/eval/qwen2.5-7b_math_dapo_s0/aime25/summary.json", "--configfile", "config/paper.yaml")
    (train,) = [t for r, t in jobs(out) if r == "train" and "run=llama3.1-8b_math_bfspo_s0" in t]
    (evaluate,) = [t for r, t in jobs(out) if r == "evaluate"]
    assert re.search(r"^\s*threads: 16$", train, re.M) and "--set threads=8 " in train
    assert re.search(r"^\s*threads: 8$", evaluate, re.M) and "--threads 8 " in evaluate
    out = dry_run("-p", "--cores", "2", "--configfile", "config/test.yaml")
    commands = [t for r, t in jobs(out) if r in ("train", "evaluate")]
    assert commands and all("--set threads=1 " in t or "--threads 1 " in t for t in commands)


def test_aime_is_evaluated_with_32_samples_at_temperature_1():
    out = dry_run("-p", "results/eval/qwen2.5-7b_math_dapo_s0/aime25/summary.json", "--configfile", "config/paper.yaml")
    (cmd,) = [t for r, t in jobs(out) if r == "evaluate"]
    assert "--samples 32 --temperature 1.0" in cmd and "--budget 1024" in cmd
    assert "--adapter results/runs/qwen2.5-7b_math_dapo_s0/adapter" in cmd


# ---- the toy and test configs ----------------------------------------------------------------

TOY_DAG = Counter(toy_data=1, toy_model=1, toy_check=1, train=7, evaluate=2 + 14, table=1, aes_consistency=1,
                  figures=1, report=1, all=1)
# config/config.yaml (issue 44): the ablation at seed 0, and the verdict table's seeds 1 and 2 of DAPO and
# BFS-PO (K = 3) besides; two tables
DEFAULT_DAG = TOY_DAG + Counter(train=4, evaluate=8, table=1, figures=1, report=1)


@pytest.mark.parametrize("configfile, dag", [(None, DEFAULT_DAG), ("config/test.yaml", TOY_DAG)])
def test_toy_dag(configfile, dag):
    """Zero-shot, DAPO, K=1..3 and the three ablations, each evaluated in- and out-of-domain, on CPU;
    the default adds seeds 1 and 2 of DAPO and BFS-PO (K = 3) for its paired table."""
    out = dry_run(*(["--configfile", configfile] if configfile else []))
    assert job_counts(out) == dag
    assert "gpu=1" not in out and "gpu=2" not in out


def test_the_default_starts_from_the_shipped_model_and_reads_the_paper_config():
    """Issue 44: `make toy` copies data/toy-model and runs no SFT (toy.build: true builds it); DAPO
    (G = 16) and BFS-PO K = 3 (trees of G = 4) train 48 chains per optimizer step, 3 questions each,
    with the first-samples filter; the ablation arms run seed 0, the verdict table seeds 0-2."""
    out = dry_run("-p")
    (model,) = [t for r, t in jobs(out) if r == "toy_model"]
    assert "bfspo toy install --shipped data/toy-model --out-dir results/toy/model --size default" in model
    assert "toy build" not in out
    trained = {re.search(r"wildcards: run=(\S+)", t).group(1): t for r, t in jobs(out) if r == "train"}
    assert sorted(trained) == sorted([f"toy_toy_{m}_s0" for m in ("bfspo-k1", "bfspo-k2", "no-bfs", "global-adv",
                                                                  "no-overlong")]
                                     + [f"toy_toy_{m}_s{s}" for m in ("dapo", "bfspo") for s in (0, 1, 2)])
    for run, g in (("toy_toy_dapo_s1", 16), ("toy_toy_bfspo_s1", 4), ("toy_toy_bfspo-k1_s0", 4)):
        for setting in (f"group_size={g}", "train_batch=48", "mini_batch=48", "filter=first_samples"):
            assert f"--set {setting}" in trained[run], (run, setting)
    assert "whole trees" not in out  # every arm's trees divide its 48 chains


def test_toy_build_true_rebuilds_the_start_model(tmp_path):
    out = dry_run("-p", "--configfile", str(write_config(tmp_path, "config/config.yaml",
                                                         lambda c: c["toy"].update(build=True), own_results=True)))
    (model,) = [t for r, t in jobs(out) if r == "toy_model"]
    assert "bfspo toy build --train results/toy/data/train.jsonl --out-dir results/toy/model" in model
    assert "toy install" not in out


def test_toy_starts_build_other_start_models_and_train_from_them_under_pinned_numerics():
    """Issue 44, item 2: config/toy-starts.yaml's other start models are the toy's SFT on the same
    data at seeds 1 and 2 (rule toy_start), each pinned, each an input of its runs and zero-shot
    evaluation. Its 30-step runs have keys of their own (config.yaml's runs train 60 steps); the 60-step
    study's shipped runs train what config.yaml's verdict runs train."""
    pinned = "env ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=AVX2 bfspo "
    out = dry_run("-p", "--configfile", "config/toy-starts.yaml")
    starts = sorted(t for r, t in jobs(out) if r == "toy_start")
    for seed, text in zip((1, 2), starts, strict=True):
        assert (f"{pinned}toy build --train results/toy/data/train.jsonl --out-dir results/toy-starts/seed{seed} "
                f"--size default --seed {seed}") in text
    trained = {re.search(r"wildcards: run=(\S+)", t).group(1): t for r, t in jobs(out) if r == "train"}
    assert sorted(trained) == sorted(f"{m}_toy_{x}_s{s}" for m in ("toy", "toy-sft1", "toy-sft2")
                                     for x in ("dapo-s30", "bfspo-s30") for s in range(5))
    for run, text in trained.items():
        assert pinned in text, run
        if run.startswith("toy-sft"):
            assert f"results/toy-starts/seed{run[7]}" in re.search(r"input: .*", text).group(0), run
    default, at_30, at_60 = (training_commands(f"config/{c}.yaml") for c in ("config", "toy-starts", "toy-starts-60"))
    for method, seed in (("dapo", 1), ("bfspo", 2)):
        ours, study = default[f"results/runs/toy_toy_{method}_s{seed}"], at_60[f"results/runs/toy_toy_{method}-s60_s{seed}"]
        assert "--set steps=60" in ours and ours == study
        assert at_30[f"results/runs/toy_toy_{method}-s30_s{seed}"] == ours.replace("steps=60", "steps=30")


def test_the_toy_rules_pin_the_cpu_numerics_of_every_toy_job_and_no_other():
    """Issue 36: the toy's data, SFT, hash, training and evaluation commands start with the `env`
    prefix of bfspo/toy/numerics.py (torch's AVX2 kernels, MKL's COMPATIBLE branch, oneDNN capped
    at AVX2); the paper config's jobs, on hub models and GPUs, keep their environment."""
    from bfspo.toy.numerics import PINNED

    pinned_bfspo = "env ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=AVX2 bfspo "
    assert PINNED == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    pinned = Counter()
    for rule, text in jobs(dry_run("-p")):
        command = re.search(r"Shell command: .*", text).group(0) if "Shell command" in text else ""
        if rule in ("toy_data", "toy_model", "toy_check", "train", "evaluate"):
            assert pinned_bfspo in command, (rule, command)
            pinned[rule] += 1
        else:
            assert "ATEN_CPU_CAPABILITY" not in text, (rule, text)
    assert pinned == Counter(toy_data=1, toy_model=1, toy_check=1, train=11, evaluate=24)
    assert "ATEN_CPU_CAPABILITY" not in dry_run("-p", "--configfile", "config/paper.yaml")


def test_native_toy_numerics_leave_the_cpu_its_kernels_in_training_and_evaluation_only(tmp_path):
    """Issue 44, item 6: `toy.numerics: native` (bench/toy_verdict_numerics.sh) drops the pinned
    prefix from the RL runs and their evaluations; the data, start model and hash stay pinned."""
    config = write_config(tmp_path, "config/config.yaml", lambda c: c["toy"].update(numerics="native"), own_results=True)
    for rule, text in jobs(dry_run("-p", "--configfile", str(config))):
        if rule in ("toy_data", "toy_model", "toy_check"):
            assert "env ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=AVX2 bfspo toy " in text, rule
        elif rule in ("train", "evaluate"):
            assert "ATEN_CPU_CAPABILITY" not in text and "bfspo " in text, (rule, text)


def test_a_dry_run_warns_of_an_arm_whose_trees_miss_its_chains_per_step(tmp_path):
    """Issue 36: the toy before it (G = 8, 64 chains in mini-batches of 32) gave K = 2 trees of 24
    chains, 48 per batch; `snakemake -n` names the arm, its tree size and the chains it reaches."""
    def before(cfg):
        cfg["train"].update(group_size=8, train_batch=64, mini_batch=32)
        cfg["methods"]["bfspo-k2"]["train"] = {"group_size": 8}

    out = dry_run("--configfile", str(write_config(tmp_path, "config/config.yaml", before, own_results=True)))
    assert "toy-ablation: arm toy_toy_bfspo-k2 (K = 2, G = 8): whole trees of 24 chains give 48 chains per batch, " \
           "against a target of 64 (75%)" in out
    assert "whole trees" not in dry_run()


@pytest.mark.parametrize("configfile, gpus", [("config/toy-seeds.yaml", 0), ("config/toy-gpu.yaml", 1)])
def test_seed_studies_plan_three_seeds_of_dapo_and_bfspo(configfile, gpus):
    out = dry_run("-p", "--configfile", configfile)
    assert job_counts(out) == Counter(toy_data=1, toy_model=1, toy_check=1, train=6, evaluate=2 + 12, table=1,
                                      aes_consistency=1, figures=1, report=1, all=1)
    runs = {re.search(r"wildcards: run=(\S+)", t).group(1) for r, t in jobs(out) if r == "train"}
    arms = ("dapo", "bfspo") if gpus else ("dapo-g8s30", "bfspo-g8s30")
    assert runs == {f"{m}_toy_{x}_s{s}" for m in ["toy-gpu" if gpus else "toy"] for x in arms for s in range(3)}
    for rule, text in jobs(out):
        if rule in ("toy_model", "train", "evaluate"):  # a CPU job asks for no GPU resource at all
            assert (f"gpu={gpus}" in text) if gpus else not re.search(r"[ ,]gpu=", text), (rule, text)
        if rule in ("train", "evaluate") and "toy_ood" not in text:
            assert "budget=160" in text or "--budget 160" in text


def test_an_ablation_is_a_few_config_lines(tmp_path):
    """docs/workflow.md's worked example: a new K value and a new method row of the toy table."""

    def add_k5(cfg):
        cfg["methods"]["bfspo-k5"] = {"label": "BFS-PO", "paper": "bfspo", "k": 5, "train": {"group_size": 4}}
        cfg["tables"]["toy-ablation"]["methods"].append("bfspo-k5")

    out = dry_run("-p", "--configfile", str(write_config(tmp_path, "config/config.yaml", add_k5, own_results=True)))
    assert job_counts(out) == DEFAULT_DAG + Counter(train=1, evaluate=2)
    assert "--set k=5" in out and f"--output-dir {tmp_path}/results/runs/toy_toy_bfspo-k5_s0" in out
    assert "whole trees" not in out  # trees of G (K + 1) = 24 chains fill the 48 of a batch


# Step 1 of docs/workflow.md's advantage recipe, as a user writes it: one function, one table entry.
LEAF_ADVANTAGE = """
import math

from bfspo.algorithm.advantages import ADVANTAGES, AdvantageKind


def leaf_advantages(tree, eps):
    \"\"\"Each chain's leaf reward minus the mean leaf reward of its tree, unscaled.\"\"\"
    leaves = tree.leaves()
    mean = math.fsum(tree.segments[i].leaf.reward for i in leaves) / len(leaves)
    for i in leaves:
        tree.segments[i].leaf.advantage = tree.segments[i].leaf.reward - mean


ADVANTAGES["leaf"] = AdvantageKind(leaf_advantages, per_chain=True)
"""


def test_an_advantage_variant_is_one_table_entry_and_a_few_config_lines(tmp_path, tiny_model_dir, train_data):
    """docs/workflow.md's advantage recipe (issue 33): without the table entry the plan refuses the name
    (it used to run as `global`); with it, the docs' config lines plan the run and `bfspo train` runs
    the new code."""
    from bfspo.algorithm import advantages
    from bfspo.pipeline import jobs
    from bfspo.pipeline.matrix import Matrix, load_config
    from bfspo.pipeline.preflight import plan_problems

    recipe = (ROOT / "docs/workflow.md").read_text().split("**A new advantage variant.**")[1]
    lines = yaml.safe_load(re.search(r"```yaml\n(.*?)```", recipe, re.S).group(1))

    def add(cfg):
        assert lines["tables"]["toy-ablation"]["methods"] == [
            *cfg["tables"]["toy-ablation"]["methods"][:-1], "leaf-adv", "no-overlong"]
        cfg["methods"].update(lines["methods"])
        cfg["tables"]["toy-ablation"]["methods"] = lines["tables"]["toy-ablation"]["methods"]

    m = Matrix(load_config(write_config(tmp_path, "config/config.yaml", add)))
    run = "toy_toy_leaf-adv_s0"
    settings = jobs.train_settings(m, run)
    assert "--set" in jobs.train_args(m, run) and "advantage=leaf" in jobs.train_args(m, run)
    built = (settings["model"],)  # the toy model, which the workflow builds (absent in a fresh clone)
    (problem,) = plan_problems({run: settings}, [], built)
    assert "advantage must be one of ('branch', 'global'), got 'leaf'" in problem and run in problem
    with pytest.raises(BfspoError, match="unknown advantage 'leaf'"):
        advantages.assign_advantages(SearchTree(prompt_ids=[1], budget=8), "leaf")

    namespace = {}
    exec(LEAF_ADVANTAGE, namespace)
    try:
        assert plan_problems({run: settings}, [], built) == []
    finally:
        advantages.ADVANTAGES.pop("leaf")

    script = tmp_path / "train_with_leaf.py"
    script.write_text(LEAF_ADVANTAGE + "\nimport sys\nfrom bfspo.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    out = tmp_path / "run"
    values = dict(model=tiny_model_dir, train_data=train_data, benchmark="gsm8k_train", k=1, group_size=4, budget=24,
                  steps=1, train_batch=8, mini_batch=8, max_empty_steps=50, threads=1, log_trees=2, advantage="leaf")
    proc = process.run([sys.executable, str(script), "train", "--output-dir", str(out),
                        "--set", *[f"{k}={v}" for k, v in values.items()]],
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    trees = [SearchTree.from_dict(json.loads(line)) for line in (out / "trees/step_00001.jsonl").read_text().splitlines()]
    assert trees and all(t.advantage_kind == "leaf" for t in trees)
    for t in trees:
        rewards = [t.segments[i].leaf.reward for i in t.leaves()]
        assert [t.segments[i].leaf.advantage for i in t.leaves()] == pytest.approx(
            [r - sum(rewards) / len(rewards) for r in rewards])
    assert json.loads((out / "done.json").read_text())["method"] == "leaf"


def test_dapos_overlong_window_is_a_method_setting(tmp_path):
    def add(cfg):
        cfg["methods"]["bfspo-dapo-window"] = {"label": "BFS-PO", "paper": "bfspo", "k": 3,
                                               "train": {"overlong_window": "dapo"}}
        cfg["tables"]["toy-ablation"]["methods"].append("bfspo-dapo-window")

    out = dry_run("-p", "--configfile", str(write_config(tmp_path, "config/config.yaml", add, own_results=True)))
    train = {re.search(r"wildcards: run=(\S+)", t).group(1): t for r, t in jobs(out) if r == "train"}
    assert "--set overlong_window=dapo" in train["toy_toy_bfspo-dapo-window_s0"]
    assert "--set overlong_window" not in train["toy_toy_bfspo_s0"]


def test_partition_and_account_are_set_in_one_place(tmp_path):
    def slurm(cfg):
        cfg["slurm"] = {"partition": "gpu", "cpu": {"partition": "cpu"}, "account": "lab"}
        cfg["resources"]["cpu"].update(gpus=1, cpus_per_gpu=4)

    out = dry_run("--configfile", str(write_config(tmp_path, "config/config.yaml", slurm, own_results=True)))
    by_rule = {}
    for rule, text in jobs(out):
        by_rule.setdefault(rule, re.search(r"resources: (.*)", text).group(1))
    assert "slurm_partition=gpu" in by_rule["train"] and "gpu=1" in by_rule["train"] and "cpus_per_gpu=4" in by_rule["train"]
    assert "slurm_partition=cpu" in by_rule["table"] and "gpu=" not in by_rule["table"]
    assert all("slurm_account=lab" in r for rule, r in by_rule.items() if rule != "all")


def test_every_job_of_the_paper_gets_the_slurm_keys(tmp_path):
    """Issue 37: with partition, account, qos and constraint set, every job of the paper's DAG, prepare
    included, goes to the partition and account, and every GPU job asks for the qos and constraint; no
    resource is left <TBD> (Snakemake's disk default) and the dry run ends without the unset line."""
    def slurm(cfg):
        cfg["slurm"].update(partition="gpu", account="lab", qos="normal", constraint="a100")

    proc = snakemake("-n", "--forceall", "--nolock", "--profile", "slurm", "--configfile",
                     str(write_config(tmp_path, "config/paper.yaml", slurm)))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    planned = [(rule, re.search(r"resources: (.*)", text).group(1)) for rule, text in jobs(out) if rule != "all"]
    assert Counter(rule for rule, _ in planned) == Counter(prepare=1, train=15, evaluate=42, table=6, figures=6,
                                                           report=6, aes_consistency=1)
    for rule, res in planned:
        assert "slurm_partition=gpu" in res and "slurm_account=lab" in res, (rule, res)
        gpu_job = re.search(r"(^|, )gpu=\d", res)
        assert gpu_job or rule not in ("train", "evaluate"), (rule, res)
        assert ("qos=normal" in res and "constraint=a100" in res) if gpu_job else "constraint=" not in res, (rule, res)
    assert "<TBD>" not in out and "never awaited" not in out and "Slurm: no" not in out


def test_a_dry_run_says_which_of_partition_and_account_are_unset(tmp_path):
    """Issue 37: the paper's dry run printed 966 lines and never said that no partition or account was
    chosen; under the Slurm profile it now ends with one line saying so and how to set them."""
    proc = snakemake("-n", "--forceall", "--nolock", "--profile", "slurm", "--configfile", "config/paper.yaml")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.rstrip().splitlines()[-1] == (
        "Slurm: no partition and account set, so jobs go to the cluster's default partition and account; set "
        "slurm.partition and slurm.account in config/paper.yaml (config/README.md, \"slurm\")")
    assert "<TBD>" not in proc.stderr and "never awaited" not in proc.stderr
    path = write_config(tmp_path, "config/paper.yaml", lambda c: c["slurm"].update(partition="gpu"))
    proc = snakemake("-n", "--forceall", "--nolock", "--profile", "slurm", "--configfile", str(path))
    assert proc.returncode == 0 and proc.stdout.rstrip().splitlines()[-1].startswith(
        f"Slurm: no account set, so jobs go to the cluster's default account; set slurm.account in {path}")
    local = snakemake("-n", "--forceall", "--nolock", "--configfile", "config/paper.yaml")  # not submitted: no line
    assert local.returncode == 0 and "Slurm: no" not in local.stdout + local.stderr


def test_a_multi_node_class_launches_srun_and_torchrun_rendezvous(tmp_path):
    def two_nodes(cfg):
        cfg["resources"]["8b"]["nodes"] = 2

    out = dry_run("-p", "results/runs/qwen2.5-7b_math_bfspo_s0/done.json",
                  "--configfile", str(write_config(tmp_path, "config/paper.yaml", two_nodes)))
    (train,) = [t for r, t in jobs(out) if r == "train"]
    assert "nodes=2" in train and "gres=gpu:2" in train and not re.search(r"[ ,]gpu=", train)  # GPUs per node
    assert "srun --nodes 2 --ntasks 2 --ntasks-per-node 1 --cpus-per-task 16 --kill-on-bad-exit=1} torchrun --nproc-per-node 2" in train
    assert "--nnodes 2 --rdzv-backend c10d" in train and "-m bfspo.cli train" in train


@pytest.mark.parametrize("edit, named", [
    (lambda c: c["models"]["qwen2.5-7b"].update(tensor_parallel=2) or c["resources"]["8b"].update(gpus=4),
     "each rank runs its own rollout engine"),
    (lambda c: c["resources"]["3b"].update(ranks=2), "'ranks' is for CPU classes"),
    (lambda c: c["resources"]["3b"].update(gpu_mem_gb=22), "train qwen2.5-3b_gsm8k_dapo_s0: needs"),
])
def test_settings_that_cannot_work_are_refused_at_plan_time(tmp_path, edit, named):
    proc = snakemake("-n", "--nolock", "--configfile", str(write_config(tmp_path, "config/paper.yaml", edit)))
    assert proc.returncode != 0 and named in proc.stdout + proc.stderr


def test_seeds_multiply_the_runs_not_the_zero_shot(tmp_path):
    """Seeds 0-2 for the ablation too: its 7 arms x 3 seeds, the verdict table's 6 runs among them."""
    out = dry_run("--configfile", str(write_config(tmp_path, "config/config.yaml", lambda c: c.update(seeds=[0, 1, 2]),
                                                   own_results=True)))
    assert job_counts(out) == DEFAULT_DAG + Counter(train=10, evaluate=20)


# ---- the test config, for real -----------------------------------------------------------------


def check_offline_wandb_runs(results: Path, env: dict) -> None:
    """Every run of the DAG (the SFT's too) is listed by `bfspo sync --list` with its project, and
    every run but the SFT is tagged table:toy-test-ablation; every training step logged each
    section once."""
    from bfspo.reporting.sync import offline_runs
    from bfspo.tracking import read_run

    listed = subprocess.run([sys.executable, "-m", "bfspo.cli", "sync", str(results), "--list"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    header, *rows = [line.split("\t") for line in listed.stdout.splitlines()]
    found = offline_runs(results)
    # one line a run (name, project, group, fragments, tags, its wandb/ folder); none was resumed here
    assert header == ["name", "project", "group", "fragments", "tags", "folder"] and {r[1] for r in rows} == {"bfspo"}
    assert sorted(Path(r[5]) for r in rows) == sorted(p.parent for p in found) and {r[3] for r in rows} == {"1"}
    assert all("table:toy-test-ablation" in r[4].split(",") for r in rows if r[0] != "sft-toy-test")
    trained = sorted(p.name for p in (results / "runs").iterdir())
    evaluated = sorted(f"{r.name}/{b.name}" for r in (results / "eval").iterdir() for b in r.iterdir())
    assert sorted(p.parents[1].name for p in found if p.parents[2].name == "runs") == trained
    assert sorted(f"{p.parents[2].name}/{p.parents[1].name}" for p in found if p.parents[3].name == "eval") == evaluated
    assert sorted(p.parents[1].name for p in found if p.parents[2].name == "wandb") == [
        "report-toy-test-ablation", "sft-toy-test"]
    for path in found:
        record = read_run(path)
        if path.parents[1].name == "sft-toy-test":
            assert record["run"]["display_name"] == "sft-toy-test" and record["history"], path
            continue
        tags, job = record["run"]["tags"], record["run"]["job_type"]
        assert "table:toy-test-ablation" in tags, (path, tags)
        if job == "report":
            assert record["run"]["display_name"] == "toy-test-ablation"
            continue
        assert "model:Toy-Qwen2 (test size)" in tags and any(t.startswith("method:") for t in tags), (path, tags)
        if job == "eval":
            assert {"eval/accuracy", "eval/accuracy_ci_low", "eval/samples._type"} <= set(record["summary"])
            continue
        assert "seed:0" in tags and record["run"]["config"]["update"]["tables"] == ["toy-test-ablation"]
        assert [h["step"] for h in record["history"]] == [1, 2]
        for section in ("rollout/accuracy", "tree/backtracks", "advantage/zero_frac", "train/grad_norm", "train/lr",
                        "timing/update_s"):
            assert all(section in h for h in record["history"]), (path, section)


def workflow_copy(tmp_path: Path) -> dict:
    """The workflow, its configs and the reported results copied to tmp_path; the environment to run it."""
    for name in ("Snakefile", "workflow", "config", "environment.yml"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    (tmp_path / "data").mkdir()
    shutil.copy(ROOT / "data/reported_results.csv", tmp_path / "data")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", WANDB_MODE="disabled")
    # An earlier test may have started wandb's service in this process: the jobs must start their own,
    # or their offline runs are written by a service that this process owns.
    env.pop("WANDB_SERVICE", None)
    return env


@pytest.mark.parametrize("command, target, log", [
    ("train", "results/runs/toy-test_toy_bfspo_s0/done.json", "logs/train/toy-test_toy_bfspo_s0.log"),
    ("evaluate", "results/eval/toy-test_zero-shot/toy/summary.json", "logs/eval/toy-test_zero-shot/toy.log"),
])
def test_a_duplicate_job_leaves_the_running_jobs_log_alone(tmp_path, command, target, log):
    """After a driver killed with SIGKILL, the rerun submits duplicates of jobs still running. Snakemake
    deletes a job's log before starting it: the duplicate must not wipe the running job's log, and
    must fail (the folder is locked), saying so in that same log."""
    from bfspo import runlock

    env = workflow_copy(tmp_path)
    data = tmp_path / "results/toy-test/data"
    data.mkdir(parents=True)
    for name in ("train", "rl_train", "toy", "toy_ood"):
        (data / f"{name}.jsonl").write_text("{}\n")
    (tmp_path / "results/toy-test/model").mkdir()  # after the data, so that Snakemake sees it up to date
    (tmp_path / "results/toy-test/model/config.json").write_text("{}")
    folder = (tmp_path / target).parent
    with runlock.hold(folder, command):  # the job still running, started by the killed driver
        (folder / f"{command}.log").write_text("the running job's output\n")
        (tmp_path / log).parent.mkdir(parents=True)
        (tmp_path / log).symlink_to(os.path.relpath(folder / f"{command}.log", (tmp_path / log).parent))
        proc = process.run([sys.executable, "-m", "snakemake", target, "--cores", "1", "--configfile",
                            "config/test.yaml"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
    assert proc.returncode != 0 and f"Error in rule {command}" in proc.stdout + proc.stderr
    kept = (folder / f"{command}.log").read_text()
    assert kept.startswith("the running job's output\n") and f"is in use by bfspo {command}" in kept, kept
    assert (tmp_path / log).resolve() == (folder / f"{command}.log").resolve()


@pytest.mark.slow
def test_a_rerun_after_the_training_data_changed_retrains(tmp_path):
    """Issue 31, finding 1: Snakemake reruns `train` when its data is newer than done.json (deleting
    done.json first); the trainer finds other content in the data file, moves the old run to
    previous/ and trains afresh, so the adapter it publishes is not the old one."""
    env = workflow_copy(tmp_path)
    target = "results/runs/toy-test_toy_bfspo_s0/done.json"

    def snakemake():
        proc = process.run([sys.executable, "-m", "snakemake", target, "--cores", "1", "--configfile",
                            "config/test.yaml"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        return json.loads((tmp_path / target).read_text())

    first = snakemake()
    data = tmp_path / "results/toy-test/data/rl_train.jsonl"
    data.write_text("".join(reversed(data.read_text().splitlines(keepends=True))))  # the same questions, reordered
    second = snakemake()
    run_dir = tmp_path / "results/runs/toy-test_toy_bfspo_s0"
    log = (run_dir / "train.log").read_text()
    assert "its inputs changed" in log and "train_data (rl_train.jsonl)" in log and "resuming" not in log, log[-3000:]
    assert second["adapter_sha256"] != first["adapter_sha256"]
    from bfspo import fingerprint

    old = fingerprint.digest(fingerprint.folder_files(run_dir / "previous/1/adapter", "adapter"))
    assert old == first["adapter_sha256"] and (run_dir / "previous/1/checkpoint").is_dir()


@pytest.mark.slow
def test_a_two_rank_class_trains_data_parallel_through_the_rule(tmp_path):
    """A size class with 2 ranks trains under torchrun (gloo on CPU), started by the train rule."""
    import torch

    env = workflow_copy(tmp_path)
    config = write_config(tmp_path, "config/test.yaml", lambda c: c["resources"]["cpu"].update(ranks=2))
    run = process.run([sys.executable, "-m", "snakemake", "results/runs/toy-test_toy_bfspo_s0/done.json",
                       "--cores", "2", "--configfile", str(config)],
                      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    run_dir = tmp_path / "results/runs/toy-test_toy_bfspo_s0"
    state = torch.load(run_dir / "checkpoint/state.pt", weights_only=True)
    assert len(state["cursors"]) == 2  # the data cursors of both ranks
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1)) and (run_dir / "adapter").is_dir()


@pytest.mark.slow
def test_test_config_runs_end_to_end(tmp_path):
    """config/test.yaml, the toy DAG at its smallest, from data generation to the report (2-3 min),
    with W&B offline: `bfspo sync --list` finds every run, which wandb's reader shows tagged with
    its tables, and each training step carries the sectioned metrics."""
    env = workflow_copy(tmp_path) | dict(WANDB_MODE="offline", WANDB_SILENT="true")
    run = process.run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "config/test.yaml"],
                      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    # issue 33: the closing message (the Snakefile's onsuccess) names the table, its figures and `bfspo sync`
    closing = run.stdout[run.stdout.index("The workflow finished."):]
    assert "  toy-test-ablation  results/tables/toy-test-ablation.md   results/figures/toy-test-ablation/" in closing
    assert "`bfspo sync results` uploads them" in closing

    table = pd.read_csv(tmp_path / "results/tables/toy-test-ablation.csv", dtype={"K": str})
    rows = table.drop_duplicates(["Method", "K"])
    assert rows["Method"].tolist() == ["Zero-shot", "DAPO", "BFS-PO", "BFS-PO", "BFS-PO", "w/o BFS", "Global Adv.", "w/o R_l"]
    assert rows["K"].astype(str).tolist() == ["-", "0", "1", "2", "3", "3", "3", "3"] and set(table["Source"]) == {"ours"}
    acc = table[table.metric == "acc"]
    assert len(acc) == 16 and acc["mean"].between(0, 100).all() and (acc["n_seeds"] == 1).all()
    assert (acc["ci_low"] <= acc["mean"]).all() and (acc["mean"] <= acc["ci_high"]).all()
    for run_id in ("dapo", "bfspo-k1", "bfspo-k2", "bfspo", "no-bfs", "global-adv", "no-overlong"):
        assert (tmp_path / f"results/runs/toy-test_toy_{run_id}_s0/adapter").is_dir()
    figures = {p.name for p in (tmp_path / "results/figures/toy-test-ablation").iterdir()}
    assert {"pareto_toy_toy.png", "pareto_toy_toy_ood.pdf", "curves_toy-test_toy.png"} <= figures
    assert json.loads((tmp_path / "results/report/toy-test-ablation.json").read_text())["group"] == "toy-test-ablation"
    assert (tmp_path / "results/tables/aes_consistency.md").is_file()
    check_offline_wandb_runs(tmp_path / "results", env)

    again = process.run([sys.executable, "-m", "snakemake", "-n", "--configfile", "config/test.yaml"],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def test_every_run_is_tagged_with_each_table_that_shows_it():
    """Table 2 (gsm8k) shares Qwen2.5-3B's DAPO and BFS-PO runs with Table 1 (ablation): their W&B
    group is one table's, but their tags name both, so a filter on table:gsm8k shows all of Table 2."""
    out = dry_run("-p", "--configfile", "config/paper.yaml")
    commands = {re.search(r"--output-dir (\S+)", text).group(1).rsplit("/", 1)[1]: text
                for rule, text in jobs(out) if rule == "train"}
    for method in ("dapo", "bfspo"):
        text = commands[f"qwen2.5-3b_gsm8k_{method}_s0"]
        assert f"method_key={method}" in text and "model_label=Qwen2.5-3B-Instruct" in text
        tables = json.loads(re.search(r"'tables=(\[.*?\])'", text).group(1))
        assert {"ablation", "gsm8k"} <= set(tables)
    assert "'tables=[\"ablation\"]'" in commands["qwen2.5-3b_gsm8k_no-bfs_s0"]
    evals = [text for rule, text in jobs(out) if rule == "evaluate" and "--run-name qwen2.5-3b_zero-shot_eval_gsm8k" in text]
    assert len(evals) == 1 and re.search(r"tables=\S*gsm8k", evals[0]) and "model_label=Qwen2.5-3B-Instruct" in evals[0]


@pytest.mark.parametrize("configfile", ["config/toy-study.yaml", "config/toy-study-hard.yaml"])
def test_toy_studies_plan_ten_paired_seeds_of_three_arms(configfile):
    out = dry_run("-p", "--configfile", configfile)
    counts = job_counts(out)
    assert (counts["train"], counts["evaluate"], counts["table"]) == (30, 2 + 60, 1)
    runs = {re.search(r"wildcards: run=(\S+)", t).group(1) for r, t in jobs(out) if r == "train"}
    model, key = ("toy-hard_toy-hard", "") if "hard" in configfile else ("toy_toy", "-g8s20")
    assert runs == {f"{model}_{m}{key}_s{s}" for m in ("dapo", "bfspo", "bfspo-prompts") for s in range(10)}
    prompts = next(t for r, t in jobs(out) if r == "train" and f"bfspo-prompts{key}_s0" in t)
    assert "--set batch_unit=prompts" in prompts and "--set train_batch=8" in prompts


def test_the_breakdown_study_plans_ten_paired_seeds_of_five_arms():
    """config/toy-breakdown.yaml (issue 25): arms a-e, each run with its own batch reading and filter."""
    out = dry_run("-p", "--configfile", "config/toy-breakdown.yaml")
    counts = job_counts(out)
    assert (counts["train"], counts["evaluate"], counts["table"]) == (50, 1 + 50, 1)
    train = {re.search(r"wildcards: run=(\S+)", t).group(1): t for r, t in jobs(out) if r == "train"}
    arms = ("dapo", "bfspo", "bfspo-first", "dapo-g32", "bfspo-4q")
    assert set(train) == {f"toy-bd_toy_{m}_s{s}" for m in arms for s in range(10)}
    settings = {m: train[f"toy-bd_toy_{m}_s0"] for m in arms}
    assert all("--set steps=30" in t for t in settings.values())
    assert "--set filter=all_leaves" in settings["bfspo"] and "--set filter=first_samples" in settings["bfspo-first"]
    assert "--set group_size=32" in settings["dapo-g32"] and "--set k=0" in settings["dapo-g32"]
    assert all(f"--set {s}" in settings["bfspo-4q"] for s in ("group_size=4", "train_batch=128", "mini_batch=64",
                                                               "filter=first_samples", "k=3"))


def test_a_contrast_must_name_the_tables_methods(tmp_path):
    def edit(cfg):
        cfg["tables"]["toy-breakdown"]["contrasts"].append({"method": "bfspo-k9", "baseline": "dapo"})

    proc = snakemake("-n", "--nolock", "--configfile", str(write_config(tmp_path, "config/toy-breakdown.yaml", edit)))
    assert proc.returncode != 0
    assert "tables.toy-breakdown.contrasts[5]: 'bfspo-k9' is not one of the table's methods" in proc.stdout + proc.stderr


def test_the_schemas_filters_are_the_algorithms():
    from bfspo.algorithm.advantages import FILTERS

    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    assert schema["$defs"]["train"]["properties"]["filter"]["enum"] == list(FILTERS)


def test_the_schemas_rollouts_are_the_trainers():
    from bfspo.rollout.streamed import ROLLOUTS

    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    assert schema["$defs"]["train"]["properties"]["rollout"]["enum"] == list(ROLLOUTS)


def test_the_schemas_samplings_are_the_trainers():
    from bfspo.training.batching import SAMPLINGS

    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    assert schema["$defs"]["train"]["properties"]["sampling"]["enum"] == list(SAMPLINGS)


def breakdown_at_ci_size(cfg):
    """The breakdown study at CI size: the test-size toy model, 2 seeds, 2 steps, 16 evaluation
    questions, G = 4 and batches of 16 chains in mini-batches of 8; arm d G = 8 (one group per
    optimizer step); arm e two 16-chain trees per batch and per optimizer step (the test model is
    right 5% of the time, too rarely for G = 2 groups to mix, and at some seeds 1%); verl's oversampling
    of 3x and up to 30 rounds, so that groups of 4 from that model fill every batch."""
    cfg["toy"].update(size="test", n_train=2000, n_rl=64, n_eval=16, build=True)  # the test-size model, not the shipped one
    cfg["toy"]["questions"].update(n_rl=64, n_eval=16)
    cfg["seeds"] = [0, 1]
    cfg["wandb"]["report"] = False
    cfg["train"].update(steps=2, group_size=4, train_batch=16, mini_batch=8, oversample=3.0, max_gen_rounds=30)
    cfg["methods"]["dapo-g32"]["train"].update(group_size=8)
    cfg["methods"]["bfspo-4q"]["train"].update(group_size=4, train_batch=32, mini_batch=32)


@pytest.mark.slow
def test_the_breakdown_study_runs_at_ci_size(tmp_path):
    """config/toy-breakdown-hard.yaml (the harder questions, drawn by toy_questions for the toy model)
    from data generation to the contrast tables and the seed-band curves, 2 seeds x 5 arms of 2
    steps: every batch full, and arm c's trees that fail the first-sample filter never expanded.
    (The current regime's config differs only in its questions; toy-study*.yaml's arms, the prompts
    reading included, run end to end in the rehearsal and the toy's DAG.)"""
    env = workflow_copy(tmp_path)
    config = write_config(tmp_path, "config/toy-breakdown-hard.yaml", breakdown_at_ci_size)
    run = process.run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", str(config)],
                      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]

    sft = {json.loads(line)["question"] for line in (tmp_path / "results/toy/data/train.jsonl").read_text().splitlines()}
    hard = [json.loads(line) for line in (tmp_path / "results/toy-hard/data/rl_train.jsonl").read_text().splitlines()]
    assert {r["steps"] for r in hard} == {5} and not sft & {r["question"] for r in hard}
    tables = tmp_path / "results/tables"
    seeds = pd.read_csv(tables / "toy-breakdown-hard_seeds.csv")
    assert len(seeds) == 10 and (seeds.questions_drawn > 0).all() and (seeds.step_s > 0).all()
    paired = pd.read_csv(tables / "toy-breakdown-hard.csv")
    assert len(paired) == 5 * (3 + 4) and (paired.n <= 2).all()
    assert (paired[paired.metric.isin(["Acc.", "Avg. Len."])].n == 2).all()
    assert (paired[paired.what == "step time"].n <= 2).all()  # the old log-probs have no timing of their own
    # AES (App. E) divides by the zero-shot accuracy: undefined where the test model solves no question
    zero = json.loads((tmp_path / "results/eval/toy-hard-bd_zero-shot/toy/summary.json").read_text())["accuracy"]
    assert (paired[paired.metric == "AES"].n == (2 if zero > 0 else 0)).all()
    assert set(zip(paired.method, paired.vs)) == {
        ("BFS-PO", "DAPO"), ("BFS-PO (first samples)", "BFS-PO"), ("DAPO (G=32)", "DAPO"), ("BFS-PO", "DAPO (G=32)"),
        ("BFS-PO (first samples, G=4, 4 trees/step)", "DAPO")}
    text = (tables / "toy-breakdown-hard.md").read_text()
    assert "Pairing checked" in text and "MDD (80%)" in text
    assert text.count("\n### ") == 5 + 3 and "### c - b: the filter" in text and "trees_all_correct" in text
    assert "### Against the zero-shot model" in text
    assert "### First samples during training" in text and "steps 2-2" in text  # 2-step runs: one step a window
    figures = tmp_path / "results/figures/toy-breakdown-hard"
    assert (figures / "paired.png").is_file() and (figures / "seed_bands_toy-hard-bd_toy-hard.png").is_file()
    runs = tmp_path / "results/runs"
    for arm in ("dapo", "bfspo", "bfspo-first", "dapo-g32", "bfspo-4q"):
        for seed in (0, 1):
            rows = [json.loads(line) for line in (runs / f"toy-hard-bd_toy-hard_{arm}_s{seed}/metrics.jsonl").read_text().splitlines()]
            assert [r["rollout/batch_full"] for r in rows] == [1, 1], (arm, seed)
    config_c = json.loads((runs / "toy-hard-bd_toy-hard_bfspo-first_s0/config.json").read_text())
    assert config_c["filter"] == "first_samples" and config_c["k"] == 3
    trees = [SearchTree.from_dict(json.loads(line)) for seed in (0, 1)
             for f in sorted((runs / f"toy-hard-bd_toy-hard_bfspo-first_s{seed}/trees").glob("*.jsonl"))
             for line in f.read_text().splitlines()]
    dropped = [t for t in trees if not keep_tree(t, "first_samples")]
    assert all(len(t.leaves()) == 4 and not t.backtracking and t.stopped["reason"].startswith("first samples all")
               for t in dropped)
    assert any(t.backtracking for t in trees)


# ---- one planning path: `bfspo plan` and `snakemake -n` give one verdict (issue 48) ----------------------


def _owned_by_another_config(cfg, tmp_path):
    cfg["results"] = str(tmp_path / "results")
    (tmp_path / "results/tables").mkdir(parents=True)
    (tmp_path / "results/tables/toy-ablation.owner").write_text("config/other.yaml\n")


CONFIGS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "config").glob("*.yaml") if p.name != "site.example.yaml")
BAD = {  # one config with each kind of problem: (base, edit(config, tmp_path), what both name)
    "schema": ("config/config.yaml", lambda c, _: c["train"].update(group_sise=4), "unknown key 'group_sise'"),
    "matrix": ("config/config.yaml", lambda c, _: c["tables"]["toy-ablation"]["methods"].append("bfspo-k9"),
               "unknown method 'bfspo-k9'"),
    "preflight": ("config/config.yaml", lambda c, _: c["train"].update(mini_batch=7),
                  "must be a multiple of mini_batch (7)"),
    "owner": ("config/config.yaml", _owned_by_another_config, "was built by the config config/other.yaml"),
    "gpu-memory": ("config/paper.yaml", lambda c, _: c["resources"]["3b"].update(gpu_mem_gb=22),
                   "train qwen2.5-3b_gsm8k_dapo_s0: needs"),
    "attempts": ("config/paper.yaml",  # at verl's fixed 3x, whose 7-8B MATH DAPO runs are the longest
                 lambda c, _: (c["resources"]["8b"].update(train_runtime=1440), c["train"].update(sampling="fixed")),
                 "more than the 3 that the Slurm profile's retries give"),
    "partition-limit": ("config/paper.yaml", lambda c, _: c["slurm"].update(max_runtime=1440),
                        "train llama3.1-8b_math_dapo_s0: time limit 2880 min, over the partition's 1440"),
}


def test_a_run_name_is_one_training_command_in_every_shipped_config():
    """A run is what it trains: two configs that plan one run folder must train it alike (they then
    share it); otherwise the second config's job stops on the first one's run (bfspo.training.run_dir:
    "another config"). toy-seeds.yaml and toy-study.yaml trained G = 8 recipes as config.yaml's
    `toy_toy_dapo_sN`, toy-paper-reading-hard.yaml and toy-study-hard.yaml two as `toy-hard_toy-hard_dapo_sN`."""
    trained: dict[str, dict[str, str]] = {}
    for configfile in CONFIGS:
        for folder, command in training_commands(configfile).items():
            trained.setdefault(folder, {})[configfile] = command
    shared = {folder: by for folder, by in trained.items() if len(by) > 1}
    assert "results/runs/toy_toy_dapo-s30_s0" in shared  # toy-paper-reading's, which toy-starts reuses
    clashes = {folder: sorted(by) for folder, by in shared.items() if len(set(by.values())) > 1}
    assert not clashes, clashes


def _verdicts(*files: str) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    plan = process.run([sys.executable, "-m", "bfspo.cli", "plan", "--config", *files], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    return plan, snakemake("-n", "--nolock", "--configfile", *files)


@pytest.mark.parametrize("files", [[c] for c in CONFIGS] + [["config/paper.yaml", "config/site.example.yaml"]],
                         ids=lambda f: "+".join(Path(p).stem for p in f))
def test_every_shipped_config_gets_one_verdict_from_bfspo_plan_and_snakemake(files):
    plan, dry = _verdicts(*files)
    assert plan.returncode == 0, plan.stdout[-2000:] + plan.stderr[-2000:]
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    for warning in re.findall(r"^Warning: .*", plan.stdout, re.M):  # and the same warnings
        assert warning in dry.stdout + dry.stderr


@pytest.mark.parametrize("kind", BAD)
def test_a_config_with_each_kind_of_problem_is_refused_by_both_naming_it(tmp_path, kind):
    base, edit, named = BAD[kind]
    path = str(write_config(tmp_path, base, lambda c: edit(c, tmp_path)))
    plan, dry = _verdicts(path)
    assert plan.returncode != 0 and dry.returncode != 0
    for out in (plan.stdout + plan.stderr, dry.stdout + dry.stderr):
        assert named in out and f"{path}: " in out, out[-3000:]


def test_a_site_file_merges_into_the_paper_config_as_a_second_configfile(tmp_path):
    """config/site.example.yaml, passed after config/paper.yaml: every job gets its partition and account
    (the CPU-only jobs their own partition), the paper's other `slurm` and `resources` keys are kept,
    and a misspelt key of the site file is refused by both paths, naming both files."""
    files = ["config/paper.yaml", "config/site.example.yaml"]
    proc = snakemake("-n", "--forceall", "--nolock", "--profile", "slurm", "--configfile", *files)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    planned = [(rule, re.search(r"resources: (.*)", text).group(1)) for rule, text in jobs(out) if rule != "all"]
    assert Counter(rule for rule, _ in planned)["train"] == 15
    for rule, res in planned:
        gpu_job = re.search(r"(^|, )gpu=\d", res)
        assert f"slurm_partition={'gpu' if gpu_job else 'cpu'}" in res and "slurm_account=my-lab" in res, (rule, res)
    limits = [int(re.search(r"runtime=(\d+)", res).group(1)) for rule, res in planned if rule == "train"]
    assert max(limits) <= 2880 < 1.2 * max(limits) and "Slurm: no" not in out  # the 8b class's train_runtime
    plan = process.run([sys.executable, "-m", "bfspo.cli", "plan", "--config", *files], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    rows = [line for line in plan.stdout.splitlines() if line.startswith("train ")]
    assert plan.returncode == 0 and len(rows) == 15 and all(row.endswith(" gpu") for row in rows)
    site = tmp_path / "site.yaml"
    site.write_text("slurm:\n  acount: lab\n")
    plan, dry = _verdicts("config/paper.yaml", str(site))
    for refused in (plan, dry):
        assert refused.returncode != 0
        assert f"config/paper.yaml + {site}: slurm: unknown key 'acount'; did you mean 'account'?" in (
            refused.stdout + refused.stderr)
