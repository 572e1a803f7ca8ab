"""Shared helpers: validate the config, derive the experiment matrix from it, and compute the
inputs, params and resources of every rule. Planning only: the rules call the `bfspo` CLI.

The matrix: every table lists models x methods x columns (train set -> benchmark). Each
(model, train set, method, seed) is one training run, planned once however many tables show it,
and each (run, benchmark) is one evaluation. Zero-shot evaluations are keyed by
(model, benchmark) only, so Table 2's and Table 3's zero-shot GSM8K rows are one job.
"""

import json
import os
import re
import shlex

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from bfspo.preflight import plan_problems


_EXPONENT_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _read_exponent_numbers(block):
    """PyYAML (YAML 1.1) reads `1e-4`, without a dot, as a string; `bfspo train --set lr=1e-4` reads
    a number, and so do the trainer settings of the config."""
    for key, value in (block or {}).items():
        if isinstance(value, str) and _EXPONENT_NUMBER.fullmatch(value):
            block[key] = float(value)


_read_exponent_numbers(config.get("train"))
for _method in (config.get("methods") or {}).values():
    if isinstance(_method, dict):
        _read_exponent_numbers(_method.get("train"))
validate(config, schema="../schemas/config.schema.yaml")

# Conda environment of every rule (`--sdm conda`); without it the rules use the active venv.
CONDA_ENV = "../envs/bfspo.yaml"

RESULTS = config.get("results", "results")
ZERO_SHOT = "zero-shot"
TOY_DATA_FILES = ["train", "rl_train", "toy", "toy_ood"]
PREPARED_SPLITS = ["gsm8k_train", "math_train", "gsm8k", "math500", "mmlu_stem", "aime25", "minerva_math"]
DATA = {"raw_dir": "data/raw", "out_dir": f"{RESULTS}/data"} | config.get("data", {})
SLURM = config.get("slurm", {})
EVALUATION = config.get("evaluation", {})
WANDB = config["wandb"]


def data_parallel_ranks(res, tensor_parallel=1):
    """Training processes per node: one per GPU (per tensor-parallel group of GPUs), each with its own
    rollout engine; a CPU class sets `ranks` itself (gloo), 1 by default."""
    return max(res["gpus"] // tensor_parallel, 1) if res["gpus"] else res.get("ranks", 1)


def _check_references():
    """Names used by tables must exist, and models' size classes and GPU counts must fit."""
    errors = []

    def known(section, name, where):
        if name not in config[section]:
            errors.append(f"{where}: unknown {section[:-1]} '{name}' (known: {', '.join(config[section])})")

    for table, spec in config["tables"].items():
        for model in spec["models"]:
            known("models", model, f"tables.{table}.models")
        for method in spec["methods"]:
            known("methods", method, f"tables.{table}.methods")
        for i, col in enumerate(spec["columns"]):
            known("train_sets", col["train_set"], f"tables.{table}.columns[{i}]")
            known("benchmarks", col["benchmark"], f"tables.{table}.columns[{i}]")
        for i, c in enumerate(spec.get("contrasts", [])):
            errors += [f"tables.{table}.contrasts[{i}]: '{c[k]}' is not one of the table's methods"
                       for k in ("method", "baseline") if c[k] not in spec["methods"]]
    for name, model in config["models"].items():
        if model["size"] not in config["resources"]:
            errors.append(
                f"models.{name}.size: unknown size class '{model['size']}' (known: {', '.join(config['resources'])})"
            )
            continue
        res = config["resources"][model["size"]]
        gpus, tp = res["gpus"], model.get("tensor_parallel", 1)
        if tp > 1 and (gpus == 0 or gpus % tp):
            errors.append(f"models.{name}.tensor_parallel: {tp} does not divide the {gpus} GPUs of class '{model['size']}'")
        elif tp > 1 and data_parallel_ranks(res, tp) > 1:
            errors.append(f"models.{name}.tensor_parallel: {tp} with {data_parallel_ranks(res, tp)} data-parallel ranks "
                          "per node; each rank runs its own rollout engine, so use tensor_parallel 1 (one rank per GPU) "
                          "or give the class exactly tensor_parallel GPUs")
        if gpus and "ranks" in res:
            errors.append(f"resources.{model['size']}.ranks: a GPU class runs one rank per GPU (or per "
                          "tensor-parallel group); 'ranks' is for CPU classes")
    toy_paths = [m["path"] for m in config["models"].values()] + [
        s["data"] for s in list(config["train_sets"].values()) + list(config["benchmarks"].values())
    ]
    if "stand_ins" in config and not config.get("train", {}).get("limit"):
        errors.append("stand_ins: the stand-ins are fine-tuned on the questions their runs train on, "
                      "so train.limit must set how many (the first N of every train set)")
    if "toy" not in config and any(p.startswith(f"{RESULTS}/toy") for p in toy_paths):
        errors.append("paths under results/toy... are built by the toy rules and need a 'toy' section")
    if errors:
        raise WorkflowError("invalid config:\n  " + "\n  ".join(errors))


_check_references()


# ---- the matrix ---------------------------------------------------------------------------


def run_id(model, train_set, method, seed):
    return f"{model}_{train_set}_{method}_s{seed}"


def zero_shot_id(model):
    return f"{model}_{ZERO_SHOT}"


def _plan():
    """run id -> its spec, in table order; the first table that shows a run names its W&B group."""
    runs = {}
    for table, spec in config["tables"].items():
        train_sets = list(dict.fromkeys(c["train_set"] for c in spec["columns"]))
        for model in spec["models"]:
            for train_set in train_sets:
                for method in spec["methods"]:
                    for seed in config["seeds"]:
                        runs.setdefault(
                            run_id(model, train_set, method, seed),
                            dict(model=model, train_set=train_set, method=method, seed=seed, table=table),
                        )
    return runs


RUNS = _plan()
# zero-shot run id -> (model, the first table that shows it)
ZERO_SHOT_RUNS = {}
for _table, _spec in config["tables"].items():
    for _model in _spec["models"]:
        ZERO_SHOT_RUNS.setdefault(zero_shot_id(_model), (_model, _table))


def _alternation(names):
    """A wildcard constraint matching exactly these names."""
    return "|".join(re.escape(n) for n in sorted(names)) or "(?!)"


RUN_RE = _alternation(RUNS)
EVAL_RUN_RE = _alternation(list(RUNS) + list(ZERO_SHOT_RUNS))
TABLE_RE = _alternation(config["tables"])


def summary(run, benchmark):
    return f"{RESULTS}/eval/{run}/{benchmark}/summary.json"


def table_summaries(table):
    """Every evaluation summary a table reads: zero-shot, then each method and seed, per column."""
    spec = config["tables"][table]
    paths = []
    for model in spec["models"]:
        for col in spec["columns"]:
            paths.append(summary(zero_shot_id(model), col["benchmark"]))
            for method in spec["methods"]:
                for seed in config["seeds"]:
                    paths.append(summary(run_id(model, col["train_set"], method, seed), col["benchmark"]))
    return list(dict.fromkeys(paths))


def table_runs(table):
    """The done.json markers of a table's training runs (figures read their metrics and trees)."""
    return [f"{RESULTS}/runs/{r}/done.json" for r, spec in RUNS.items() if _in_table(spec, table)]


def tables_of(run):
    """Every table that shows a training run, or, for a zero-shot run id, its model."""
    if run in RUNS:
        return [t for t in config["tables"] if _in_table(RUNS[run], t)]
    return [t for t, spec in config["tables"].items() if ZERO_SHOT_RUNS[run][0] in spec["models"]]


def _in_table(run, table):
    spec = config["tables"][table]
    return (
        run["model"] in spec["models"]
        and run["method"] in spec["methods"]
        and any(c["train_set"] == run["train_set"] for c in spec["columns"])
    )


def table_spec(table):
    """What `bfspo tables` and `bfspo figures` need to lay out one table, as JSON."""
    spec = config["tables"][table]
    return json.dumps(
        dict(
            name=table,
            title=spec["title"],
            layout=spec["layout"],
            models=[dict(key=m, label=config["models"][m]["label"]) for m in spec["models"]],
            methods=[
                dict(
                    key=m,
                    label=config["methods"][m]["label"],
                    paper=config["methods"][m].get("paper"),
                    k=config["methods"][m]["k"],
                    selection=config["methods"][m].get("selection", "bfs"),
                    advantage=config["methods"][m].get("advantage", "branch"),
                    overlong=config["methods"][m].get("overlong", True),
                    color=config["methods"][m].get("color"),
                )
                for m in spec["methods"]
            ],
            columns=[
                dict(
                    col,
                    label=config["benchmarks"][col["benchmark"]].get("label", col["benchmark"]),
                    train_label=config["train_sets"][col["train_set"]].get("label", col["train_set"]),
                )
                for col in spec["columns"]
            ],
            paper_tables=spec.get("paper_tables", []),
            reported=spec.get("reported"),
            contrasts=spec.get("contrasts"),
        ),
        separators=(",", ":"),
    )


def output_dir(wildcards, output):
    """The folder of a rule's first output (params derived from outputs survive remote file systems)."""
    return os.path.dirname(output[0])


def logged_in_output_dir(name, log_pattern):
    """A params function: where the rule's log (log_pattern) links to, relative to the log's folder:
    the file `name` in the job's output folder, which every attempt appends to.

    Snakemake deletes a job's log file before it starts the job; with the log a link, it deletes
    only the link. So a duplicate of a job still running (after a driver killed with SIGKILL) leaves
    the running job's log alone: it adds its refusal of the locked folder to the end."""

    def link(wildcards, output):
        log_dir = os.path.dirname(log_pattern.format(**dict(wildcards.items())))
        return os.path.relpath(os.path.join(os.path.dirname(output[0]), name), log_dir)

    return link


def input_dir(wildcards, input):
    return os.path.dirname(input[0])


def toy_data_args(section):
    """`bfspo toy data` split sizes and difficulty that a config section (`toy`, `toy.questions`)
    sets (the rest keep the CLI's defaults)."""
    keys = ("n_train", "n_rl", "n_eval", "max_value", "max_operand", "min_steps", "max_steps")
    return " ".join(f"--{k.replace('_', '-')} {section[k]}" for k in keys if k in section)


def reported_inputs():
    return [config["reported_results"]] if config.get("reported_results") else []


def reported_arg():
    return f"--reported {shlex.quote(config['reported_results'])}" if config.get("reported_results") else ""


def final_outputs():
    outputs = []
    for table in config["tables"]:
        outputs += expand(f"{RESULTS}/tables/{table}.{{ext}}", ext=["csv", "md", "tex"])
        outputs.append(f"{RESULTS}/figures/{table}")
        if WANDB.get("report", True):
            outputs.append(f"{RESULTS}/report/{table}.json")
    if config.get("reported_results"):
        outputs.append(f"{RESULTS}/tables/aes_consistency.csv")
    if "stand_ins" in config:
        outputs.append(f"{RESULTS}/rehearsal_check.json")
    return outputs


# ---- models, data and resources ------------------------------------------------------------


def model_of(run):
    """The model key of a training run or a zero-shot run id."""
    return RUNS[run]["model"] if run in RUNS else ZERO_SHOT_RUNS[run][0]


def stand_in_path(size):
    return f"{config['stand_ins']['dir']}/{size}"


def stand_in_init_path(size):
    """The random-init step of a stand-in, before its SFT."""
    return f"{config['stand_ins']['dir']}/init/{size}"


def model_inputs(model):
    """A model built by this workflow (the toy, a stand-in) is an input; a hub id or an outside path is not."""
    spec = config["models"][model]
    built = []
    if "toy" in config:
        built.append(config["toy"]["model_dir"])
    if "stand_ins" in config:
        built.append(stand_in_path(spec["size"]))
    return [spec["path"]] if spec["path"] in built else []


def stand_in_data():
    """What a stand-in's tokenizer and max positions cover: every train set and benchmark, as
    `BENCHMARK=FILE` (the benchmark whose prompt renders the file), and the largest budget."""
    pairs = {f"{s['benchmark']}={s['data']}" for s in config["train_sets"].values()}
    pairs |= {f"{name}={b['data']}" for name, b in config["benchmarks"].items()}
    budget = max(s["budget"] for s in list(config["train_sets"].values()) + list(config["benchmarks"].values()))
    return sorted(pairs), budget


def size_class(run):
    return config["resources"][config["models"][model_of(run)]["size"]]


def _gpus(run, stage):
    res = size_class(run)
    return res.get("eval_gpus", min(res["gpus"], 1)) if stage == "eval" else res["gpus"]


def _ranks(run):
    return data_parallel_ranks(size_class(run), config["models"][model_of(run)].get("tensor_parallel", 1))


def _nodes(run, stage):
    return size_class(run).get("nodes", 1) if stage == "train" else 1


def _threads(run, stage):
    res = size_class(run)
    gpus = _gpus(run, stage)
    if gpus:
        return gpus * res.get("cpus_per_gpu", 1)
    return res.get("cpus", 1) * (_ranks(run) if stage == "train" else 1)


def train_launcher(wildcards):
    """The command that starts `bfspo train`: the plain entry point for one process; torchrun with
    one rank per GPU on one node; srun + torchrun's c10d rendezvous across several nodes."""
    ranks, nodes = _ranks(wildcards.run), _nodes(wildcards.run, "train")
    if ranks * nodes == 1:
        return "bfspo"
    torchrun = f"torchrun --nproc-per-node {ranks}"
    if nodes == 1:
        return f"{torchrun} --standalone -m bfspo.cli"
    head = "$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)"
    return (f"srun --nodes {nodes} --ntasks-per-node 1 {torchrun} --nnodes {nodes} --rdzv-backend c10d "
            f"--rdzv-endpoint {head}:29500 --rdzv-id \"$SLURM_JOB_ID\" -m bfspo.cli")


def _partition(gpu_job):
    if gpu_job:
        return SLURM.get("partition")
    return SLURM.get("cpu_partition") or SLURM.get("partition")


def slurm_resources(gpu_job=lambda wc: False):
    """Partition and account (config key `slurm`), only where set; `gpu_job(wc)` picks the partition."""
    res = {}
    if SLURM.get("partition") or SLURM.get("cpu_partition"):
        res["slurm_partition"] = lambda wc: _partition(gpu_job(wc)) or ""
    if SLURM.get("account"):
        res["slurm_account"] = SLURM["account"]
    return res


def job_resources(stage):
    """Resources of a train or evaluate job, scaled by its model's size class (a CPU class has gpus 0)."""
    return dict(
        gpu=lambda wc: _gpus(wc.run, stage),
        nodes=lambda wc: _nodes(wc.run, stage),
        tasks_per_gpu=0,  # one Slurm task per job; torchrun (or srun, across nodes) starts the ranks
        cpus_per_gpu=lambda wc: size_class(wc.run).get("cpus_per_gpu", 0) if _gpus(wc.run, stage) else 0,
        mem_mb=lambda wc: size_class(wc.run)["mem_mb"],
        runtime=lambda wc: size_class(wc.run)[f"{stage}_runtime"],
        **slurm_resources(lambda wc: _gpus(wc.run, stage) > 0),
    )


def job_threads(stage):
    return lambda wc: _threads(wc.run, stage)


# ---- command-line arguments ------------------------------------------------------------------


def _cli_value(value):
    """A value as `bfspo train --set key=value` parses it (a YAML scalar, or a JSON list)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def train_settings(run):
    """Every TrainConfig field of one run: config defaults, then the method's, then the run's own."""
    spec = RUNS[run]
    model = config["models"][spec["model"]]
    train_set = config["train_sets"][spec["train_set"]]
    method = config["methods"][spec["method"]]
    return (
        dict(config.get("train", {}))
        | method.get("train", {})
        | {key: train_set[key] for key in ("val_data", "val_benchmark") if key in train_set}
        | ({"wandb_tags": WANDB["tags"]} if WANDB.get("tags") else {})
        | dict(
            model=model["path"],
            train_data=train_set["data"],
            benchmark=train_set["benchmark"],
            budget=train_set["budget"],
            k=method["k"],
            selection=method.get("selection", "bfs"),
            advantage=method.get("advantage", "branch"),
            overlong=method.get("overlong", True),
            seed=spec["seed"],
            tensor_parallel_size=model.get("tensor_parallel", 1),
            wandb_project=WANDB["project"],
            wandb_group=spec["table"],
            wandb_mode=WANDB["mode"],
            run_name=run,
            method_key=spec["method"],
            model_label=config["models"][spec["model"]]["label"],
            tables=tables_of(run),
        )
    )


def train_args(wildcards):
    return " ".join(f"--set {shlex.quote(f'{k}={_cli_value(v)}')}" for k, v in train_settings(wildcards.run).items())


def sft_wandb_args(name):
    """`--wandb-*` options of an SFT job (`bfspo toy build`, `bfspo stand-in-sft`): a W&B run called
    `name` in group `sft`, written to {RESULTS}/wandb/<name>; none when W&B is disabled."""
    if WANDB["mode"] == "disabled":
        return ""
    args = ["--wandb-project", WANDB["project"], "--wandb-group", "sft", "--wandb-mode", WANDB["mode"],
            "--wandb-dir", f"{RESULTS}/wandb/{name}", "--run-name", name]
    return " ".join(shlex.quote(a) for a in args + (["--wandb-tags", *WANDB["tags"]] if WANDB.get("tags") else []))


def eval_args(wildcards):
    """`bfspo evaluate` options of one (run, benchmark): model, adapter, protocol, meta."""
    run, bench = wildcards.run, wildcards.benchmark
    model = model_of(run)
    b = config["benchmarks"][bench]
    args = ["--model", config["models"][model]["path"], "--benchmark", bench, "--data", b["data"], "--budget", b["budget"]]
    args += [x for key in ("samples", "temperature") if key in b for x in (f"--{key}", b[key])]
    args += [x for key in ("engine", "batch_size", "limit") if key in EVALUATION for x in (f"--{key.replace('_', '-')}", EVALUATION[key])]
    args += ["--seed", EVALUATION.get("seed", 0)]
    meta = dict(run=run, model=model, model_label=config["models"][model]["label"], method=ZERO_SHOT,
                tables=",".join(tables_of(run)))
    if run in RUNS:
        args += ["--adapter", f"{RESULTS}/runs/{run}/adapter"]
        meta |= dict(method=RUNS[run]["method"], train_set=RUNS[run]["train_set"], seed=RUNS[run]["seed"])
    if WANDB["mode"] != "disabled":
        table = RUNS[run]["table"] if run in RUNS else ZERO_SHOT_RUNS[run][1]
        args += ["--wandb-project", WANDB["project"], "--wandb-group", table, "--wandb-mode", WANDB["mode"],
                 "--run-name", f"{run}_eval_{bench}"] + (["--wandb-tags", *WANDB["tags"]] if WANDB.get("tags") else [])
    args += ["--meta"] + [f"{k}={v}" for k, v in meta.items()]
    return " ".join(shlex.quote(str(a)) for a in args)


# Refuse at plan time what every job would refuse: each run's settings (through TrainConfig), each
# evaluation's protocol and budget (bfspo/preflight.py).
_PROBLEMS = plan_problems({r: train_settings(r) for r in RUNS}, [
    dict(config["benchmarks"][c["benchmark"]], benchmark=c["benchmark"], model=config["models"][m]["path"])
    for spec in config["tables"].values() for m in spec["models"] for c in spec["columns"]])
if _PROBLEMS:
    raise WorkflowError("invalid config:\n  " + "\n  ".join(_PROBLEMS))
