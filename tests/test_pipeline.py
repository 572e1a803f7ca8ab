"""The experiment matrix (bfspo/pipeline/matrix.py, jobs.py), tested directly, without Snakemake:
the runs, evaluations and tables each config plans, the settings, arguments, launchers and
resources of their jobs, and the config errors that stop a plan. tests/test_workflow.py checks
that the rules plan the same through `snakemake -n`."""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path

import pytest
import yaml

from bfspo.pipeline import gpu_plan, jobs
from bfspo.pipeline.matrix import ConfigError, Matrix, load_config, normalise_numbers, run_id

ROOT = Path(__file__).resolve().parents[1]
_CONFIGS = {}


def config(name: str) -> dict:
    """A config of config/, validated as the workflow validates it (a fresh copy each time)."""
    if name not in _CONFIGS:
        _CONFIGS[name] = load_config(ROOT / "config" / name)
    return copy.deepcopy(_CONFIGS[name])


@pytest.fixture(scope="module")
def paper() -> Matrix:
    return Matrix(config("paper.yaml"))


def test_paper_matrix_is_the_papers_experiments(paper):
    t1 = {run_id("qwen2.5-3b", "gsm8k", m, 0) for m in
          ("dapo", "bfspo-k1", "bfspo-k2", "bfspo", "no-bfs", "global-adv", "no-overlong")}
    t2 = {run_id(m, "gsm8k", x, 0) for m in ("qwen2.5-3b", "llama3.1-8b", "qwen2.5-7b") for x in ("dapo", "bfspo")}
    t3 = {run_id(m, "math", x, 0) for m in ("llama3.1-8b", "qwen2.5-7b") for x in ("dapo", "bfspo")}
    assert set(paper.runs) == t1 | t2 | t3 and len(paper.runs) == 15
    evaluations = paper.evaluations()
    zero_shot = [(r, b) for r, b in evaluations if r.endswith("_zero-shot")]
    assert (len(evaluations), len(zero_shot)) == (42, 11)  # docs/workflow.md's table
    assert [b for r, b in zero_shot if r == "qwen2.5-7b_zero-shot"] == [
        "gsm8k", "math500", "mmlu_stem", "aime25", "minerva_math"]
    # Table 1's K=0 and K=3 runs are Table 2's: one run, in the first table's group, tagged with both
    assert paper.runs["qwen2.5-3b_gsm8k_dapo_s0"]["table"] == "ablation"
    assert paper.tables_of("qwen2.5-3b_gsm8k_bfspo_s0") == ["ablation", "gsm8k", "tokenskip-qwen"]
    assert paper.tables_of("qwen2.5-3b_zero-shot") == ["ablation", "gsm8k", "tokenskip-qwen"]
    assert paper.group_of("llama3.1-8b_zero-shot") == "gsm8k"


def test_seeds_multiply_the_runs_not_the_zero_shot():
    one, three = config("config.yaml"), config("config.yaml")
    for cfg in (one, three):  # the ablation alone: the verdict table sets its own seeds
        del cfg["tables"]["toy-verdict"]
    three["seeds"] = [0, 1, 2]
    a, b = Matrix(one), Matrix(three)
    assert (len(a.runs), len(b.runs)) == (7, 21)
    zero = lambda m: [e for e in m.evaluations() if e[0].endswith("_zero-shot")]  # noqa: E731
    assert zero(a) == zero(b) and len(b.evaluations()) - len(zero(b)) == 3 * (len(a.evaluations()) - len(zero(a)))


def test_a_tables_summaries_and_runs(paper):
    summaries = paper.table_summaries("math")
    assert len(summaries) == 2 * 5 * (1 + 2) and summaries[0] == "results/eval/llama3.1-8b_zero-shot/math500/summary.json"
    assert paper.table_runs("tokenskip-qwen") == ["results/runs/qwen2.5-3b_gsm8k_bfspo_s0/done.json",
                                                   "results/runs/qwen2.5-7b_gsm8k_bfspo_s0/done.json"]
    spec = yaml.safe_load(paper.table_spec("ablation"))
    assert [m["key"] for m in spec["methods"]][:2] == ["dapo", "bfspo-k1"] and spec["methods"][0]["k"] == 0
    assert spec["columns"] == [{"train_set": "gsm8k", "benchmark": "gsm8k", "domain": "in", "label": "GSM8K",
                                "train_label": "GSM8K"}]


def test_final_outputs():
    m = Matrix(config("test.yaml"))
    assert m.final_outputs() == [f"results/tables/toy-test-ablation.{e}" for e in ("csv", "md", "tex")] + [
        "results/figures/toy-test-ablation", "results/report/toy-test-ablation.json",
        "results/tables/aes_consistency.csv", "results/toy-test/model.sha256"]


def test_train_settings_take_the_config_then_the_method_then_the_run(paper):
    cfg = config("paper.yaml")
    cfg["methods"]["dapo"]["train"] = {"lr": 2e-6, "group_size": 8}
    m = Matrix(cfg)
    s = jobs.train_settings(m, "qwen2.5-7b_math_dapo_s0")
    assert (s["lr"], s["group_size"], s["weight_decay"]) == (2e-6, 8, 0.01)
    assert (s["model"], s["budget"], s["k"], s["benchmark"]) == ("Qwen/Qwen2.5-7B-Instruct", 1024, 0, "math_train")
    assert s["tables"] == ["math"] and s["wandb_group"] == "math" and s["run_name"] == "qwen2.5-7b_math_dapo_s0"
    args = shlex.split(jobs.train_args(m, "qwen2.5-7b_math_dapo_s0"))
    assert args[args.index("lr=2e-06") - 1] == "--set" and 'tables=["math"]' in args
    assert "gradient_checkpointing=true" in args


def test_gpu_jobs_ask_for_cuda_and_cpu_jobs_take_the_default(paper):
    """A GPU class's train and evaluate jobs stop at once without CUDA (`device=cuda`) instead of
    running on the CPU; a CPU class's jobs keep `auto`."""
    run = "qwen2.5-7b_math_dapo_s0"
    assert jobs.train_settings(paper, run)["device"] == "cuda"
    assert "device=cuda" in shlex.split(jobs.train_args(paper, run))
    args = shlex.split(jobs.eval_args(paper, run, "math500"))
    assert args[args.index("--device") + 1] == "cuda"
    assert "--device cuda" in jobs.eval_args(paper, "qwen2.5-3b_zero-shot", "gsm8k")
    cfg = config("paper.yaml")
    cfg["resources"]["8b"]["eval_gpus"] = 0  # evaluations of the class on the CPU
    assert "--device" not in jobs.eval_args(Matrix(cfg), run, "math500")
    toy = Matrix(config("config.yaml"))
    toy_run = next(iter(toy.runs))
    assert "device" not in jobs.train_settings(toy, toy_run) and "--device" not in jobs.eval_args(toy, toy_run, "toy")


def test_eval_args(paper):
    args = shlex.split(jobs.eval_args(paper, "qwen2.5-7b_math_dapo_s0", "aime25"))
    assert args[:8] == ["--model", "Qwen/Qwen2.5-7B-Instruct", "--benchmark", "aime25", "--data",
                        "results/data/aime25.jsonl", "--budget", "1024"]
    assert "--samples 32 --temperature 1.0" in " ".join(args)
    assert args[args.index("--adapter") + 1] == "results/runs/qwen2.5-7b_math_dapo_s0/adapter"
    assert "method=dapo" in args and "train_set=math" in args and args[args.index("--wandb-group") + 1] == "math"
    zero = shlex.split(jobs.eval_args(paper, "qwen2.5-3b_zero-shot", "gsm8k"))
    assert "--adapter" not in zero and "method=zero-shot" in zero and "tables=ablation,gsm8k,tokenskip-qwen" in zero


def test_resources_and_launchers_by_size_class(paper):
    """Without a GPU plan (tests/test_plan.py checks what a plan adds: time limit, signal, srun step)."""
    small, big = "qwen2.5-3b_gsm8k_dapo_s0", "llama3.1-8b_math_bfspo_s0"
    assert jobs.train_launcher(paper, small).endswith("} bfspo")
    assert jobs.train_launcher(paper, big).endswith(
        "} torchrun --nproc-per-node 2 --signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 --standalone -m bfspo.cli")
    r = jobs.job_resources(paper, big, "train")
    assert (r["gpu"], r["nodes"], r["cpus_per_gpu"], r["tasks_per_gpu"]) == (2, 1, 8, 0)
    assert jobs.job_resources(paper, big, "eval")["gpu"] == 1 and jobs.threads(paper, big, "train") == 16
    assert r["slurm_partition"] is None and set(r) == set(jobs.RESOURCE_NAMES)
    toy = Matrix(config("config.yaml"))
    run = next(iter(toy.runs))
    assert jobs.job_resources(toy, run, "train")["gpu"] is None and jobs.train_launcher(toy, run) == "bfspo"
    two = config("config.yaml")
    two["resources"]["cpu"]["ranks"] = 2
    assert jobs.train_launcher(Matrix(two), run) == "torchrun --nproc-per-node 2 --standalone -m bfspo.cli"


def test_partition_and_account_are_set_in_one_place():
    cfg = config("config.yaml")
    cfg["slurm"] |= {"partition": "gpu", "cpu": {"partition": "cpu"}, "account": "lab"}
    cfg["resources"]["cpu"].update(gpus=1, cpus_per_gpu=4)
    m = Matrix(cfg)
    r = jobs.job_resources(m, next(iter(m.runs)), "train")
    assert (r["slurm_partition"], r["slurm_account"], r["gpu"]) == ("gpu", "lab", 1)
    assert jobs.slurm_resources(m) == {"slurm_partition": "cpu", "slurm_account": "lab"}


def test_the_slurm_keys_reach_the_jobs_they_apply_to(paper):
    """Issue 37: qos, reservation and extra on every job, constraint and gpu_type on GPU jobs, `cpu`
    for the CPU-only ones, `sizes` for a class; null in `cpu` or `sizes` unsets a key."""
    cfg = config("paper.yaml")
    cfg["slurm"] |= {"partition": "gpu", "account": "lab", "qos": "normal", "constraint": "a100",
                     "reservation": "paper", "extra": "--mail-type=FAIL --wckey='two words'",
                     "cpu": {"partition": "cpu", "qos": None},
                     "sizes": {"8b": {"constraint": "a100-80gb", "gpu_type": "a100", "extra": None}}}
    m = Matrix(cfg)
    plan = gpu_plan.plan_matrix(m).train["qwen2.5-3b_gsm8k_bfspo_s0"]
    small = jobs.job_resources(m, "qwen2.5-3b_gsm8k_bfspo_s0", "train", plan)
    assert (small["slurm_partition"], small["slurm_account"], small["qos"], small["constraint"]) == (
        "gpu", "lab", "normal", "a100")
    assert (small["gpu"], small["gres"]) == (1, None)
    assert small["slurm_extra"] == (f"--signal=USR1@{plan.signal_s} --reservation=paper --mail-type=FAIL "
                                    "'--wckey=two words'")  # the signal first, every word quoted
    big = jobs.job_resources(m, "llama3.1-8b_math_bfspo_s0", "train")
    assert (big["constraint"], big["gpu"], big["gres"], big["qos"]) == ("a100-80gb", None, "gpu:a100:2", "normal")
    assert big["slurm_extra"] == "--reservation=paper"
    assert jobs.job_resources(m, "llama3.1-8b_zero-shot", "eval")["gres"] == "gpu:a100:1"
    assert jobs.slurm_resources(m) == {"slurm_partition": "cpu", "slurm_account": "lab",
                                       "slurm_extra": "--reservation=paper --mail-type=FAIL '--wckey=two words'"}
    assert set(small) == set(jobs.RESOURCE_NAMES)
    toy = config("config.yaml")  # a CPU class (as the rehearsal makes every class) takes no GPU node keys
    toy["slurm"] = {"sizes": {"cpu": {"constraint": "a100", "gpu_type": "a100", "qos": "short"}}}
    t = jobs.job_resources(Matrix(toy), "toy_toy_bfspo_s0", "train")
    assert (t["constraint"], t["gpu"], t["gres"], t["qos"]) == (None, None, None, "short")
    unset = jobs.job_resources(paper, "llama3.1-8b_math_bfspo_s0", "train")
    assert all(unset[k] is None for k in ("slurm_partition", "slurm_account", "qos", "constraint", "slurm_extra"))
    assert jobs.slurm_resources(paper) == {}


@pytest.mark.parametrize("slurm, named", [
    ({"sizes": {"9b": {"qos": "x"}}}, "slurm.sizes.9b: unknown size class '9b' (known: 3b, 8b)"),
    ({"cpu": {"gpu_type": "a100"}}, "slurm.cpu.gpu_type: CPU-only jobs ask for no GPU"),
    ({"extra": "--qos=high"}, "slurm.extra: '--qos' is not allowed here (use slurm.qos)"),
    ({"extra": "--gres=gpu:2"}, "slurm.extra: '--gres' is not allowed here (use slurm.gpu_type)"),
    ({"extra": "--time 10"}, "slurm.extra: '--time' is not allowed here (use the size class's train_runtime"),
    ({"sizes": {"8b": {"extra": "--signal=USR2@60"}}}, "slurm.sizes.8b.extra: '--signal' is not allowed here (bfspo "
                                                        "sets the trainer's warning signal"),
    ({"cpu": {"extra": "--mail-user='x"}}, "slurm.cpu.extra: \"--mail-user='x\" does not split into sbatch options"),
], ids=["unknown-class", "cpu-gpu-type", "qos", "gres", "time", "signal", "unbalanced-quote"])
def test_slurm_keys_that_cannot_work_are_refused(slurm, named):
    cfg = config("paper.yaml")
    cfg["slurm"] |= slurm
    with pytest.raises(ConfigError, match=re.escape(named)):
        Matrix(cfg)


@pytest.mark.parametrize("slurm, named", [
    ({"qoss": "high"}, "slurm: unknown key 'qoss'; did you mean 'qos'?"),
    ({"constraint": "a100'; rm -rf ~"}, "slurm.constraint: \"a100'; rm -rf ~\" is not valid here (pattern"),
    ({"gpu_type": "a100:2"}, "slurm.gpu_type: 'a100:2' is not valid here (pattern"),
    ({"sizes": {"8b": {"constrant": "x"}}}, "slurm.sizes.8b: unknown key 'constrant'; did you mean 'constraint'?"),
    ({"cpu": {"partition": "a b"}}, "slurm.cpu.partition: 'a b' is not valid here (pattern"),
], ids=["unknown-key", "shell-in-constraint", "gpu-type-with-count", "unknown-size-key", "space-in-partition"])
def test_the_schema_knows_the_slurm_keys(tmp_path, slurm, named):
    text = yaml.safe_dump(yaml.safe_load((ROOT / "config/paper.yaml").read_text()) | {"slurm": slurm})
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ConfigError, match=re.escape(named)):
        load_config(tmp_path / "c.yaml")
    ok = yaml.safe_load(text) | {"slurm": {"qos": "normal", "constraint": "a100&nvlink", "gpu_type": "a100",
                                           "reservation": "r1", "extra": "--exclusive", "cpu": {"qos": None},
                                           "sizes": {"8b": {"constraint": "[rack1|rack2]"}}}}
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(ok))
    assert load_config(tmp_path / "ok.yaml")["slurm"]["qos"] == "normal"


@pytest.mark.parametrize("edit, named", [
    (lambda c: c["tables"]["toy-ablation"]["methods"].append("bfspo-k9"), "unknown method 'bfspo-k9'"),
    (lambda c: c["models"]["toy"].update(size="huge"), "unknown size class 'huge'"),
    (lambda c: c.pop("toy"), "need a 'toy' section"),
], ids=["unknown-method", "unknown-size", "no-toy-section"])
def test_config_errors_name_the_problem(edit, named):
    cfg = config("config.yaml")
    edit(cfg)
    with pytest.raises(ConfigError, match=named):
        Matrix(cfg)


@pytest.mark.parametrize("edit, named", [
    (lambda c: c["models"]["qwen2.5-7b"].update(tensor_parallel=2) or c["resources"]["8b"].update(gpus=4),
     "each rank runs its own rollout engine"),
    (lambda c: c["resources"]["3b"].update(ranks=2), "'ranks' is for CPU classes"),
    (lambda c: c["resources"]["3b"].update(cpus_per_gpu=1), "gpus x cpus_per_gpu must be at least 2"),
    (lambda c: c["resources"]["3b"].update(gpus=0, nodes=2), "training across nodes is for GPU classes"),
])
def test_data_parallel_settings_that_cannot_work_are_refused(edit, named):
    cfg = config("paper.yaml")
    edit(cfg)
    with pytest.raises(ConfigError, match=named):
        Matrix(cfg)


def test_exponent_numbers_are_numbers(tmp_path):
    cfg = {"train": {"lr": "1e-4", "engine": "vllm"}, "methods": {"a": {"train": {"weight_decay": "5E-3"}}, "b": {}}}
    normalise_numbers(cfg)
    assert cfg["train"] == {"lr": 1e-4, "engine": "vllm"} and cfg["methods"]["a"]["train"]["weight_decay"] == 5e-3
    path = tmp_path / "c.yaml"
    path.write_text((ROOT / "config/config.yaml").read_text().replace("\n  lr: 1.0e-3\n", "\n  lr: 1e-4\n"))
    assert load_config(path)["train"]["lr"] == 1e-4


def test_an_invalid_file_is_refused_naming_the_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text((ROOT / "config/config.yaml").read_text() + "\nlearning_rate: 1\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: unknown key 'learning_rate'")):
        load_config(path)
    path.write_text((ROOT / "config/paper.yaml").read_text().replace("  qos: null", "  qoss: null"))
    with pytest.raises(ConfigError, match=re.escape(f"{path}: slurm: unknown key 'qoss'; did you mean 'qos'?")):
        load_config(path)


def test_the_closing_message_names_the_tables_figures_and_sync_command(tmp_path, monkeypatch):
    """Issue 33: `make toy` ended with Snakemake's "Elapsed time", pointing nowhere."""
    cfg = config("config.yaml")
    monkeypatch.chdir(tmp_path)
    m = Matrix(cfg)
    assert m.closing_message("offline").splitlines() == [
        "The workflow finished.",
        "W&B runs are offline under results/: `bfspo sync results` uploads them (`bfspo sync results --list` lists them)."]
    (tmp_path / "results" / "tables").mkdir(parents=True)
    for table in cfg["tables"]:
        (tmp_path / "results" / "tables" / f"{table}.md").write_text("")
    lines = m.closing_message("offline").splitlines()
    assert lines[1] == "Tables (.md, .csv and .tex in results/tables/) and figures:"
    assert [line.split() for line in lines[2:-1]] == [
        [t, f"results/tables/{t}.md", f"results/figures/{t}/"] for t in cfg["tables"]]
    assert "W&B" not in m.closing_message("disabled")
    assert "logged live" in m.closing_message("online")
    rehearsal = Matrix(config("paper.yaml") | {"stand_ins": {"dir": "x"}, "train": {"limit": 8}})
    assert "`bfspo sync results --rehearsal` uploads" in rehearsal.closing_message("offline")
