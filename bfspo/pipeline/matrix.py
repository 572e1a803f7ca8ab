"""The experiment matrix of a workflow config: its training runs, zero-shot runs and tables.

Every table lists models x methods x columns (train set -> benchmark). Each (model, train set,
method, seed) is one training run, planned once however many tables show it, and each (run,
benchmark) is one evaluation. Zero-shot evaluations are keyed by (model, benchmark) only, so
Table 2's and Table 3's zero-shot GSM8K rows are one job. The first table that shows a run (in
file order) names its W&B group.

`Matrix(config)` takes the config as the workflow hands it over: read by YAML, numbers normalised
by `normalise_numbers`, validated against workflow/schemas/config.schema.yaml (defaults filled).
It checks what the schema cannot (names that tables use, size classes, GPU counts) and raises a
ConfigError naming every problem.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

from bfspo.errors import BfspoError
from bfspo.pipeline import slurm
from bfspo.pipeline.schema import SCHEMA, ConfigProblems, SchemaError, validate_config

ZERO_SHOT = "zero-shot"
TOY_DATA_FILES = ["train", "rl_train", "toy", "toy_ood"]
PREPARED_SPLITS = ["gsm8k_train", "math_train", "gsm8k", "math500", "mmlu_stem", "aime25", "minerva_math"]
_EXPONENT_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+")


class ConfigError(ConfigProblems):
    """A workflow config that cannot be read or planned (one line per problem, `ConfigProblems`)."""


def normalise_numbers(config: dict) -> None:
    """PyYAML (YAML 1.1) reads `1e-4`, without a dot, as a string; `bfspo train --set lr=1e-4` reads
    a number, and so do the trainer settings of the config (`train`, each size class's and each
    method's `train`). In place, before validation."""
    blocks = [config.get("train")]
    for section in ("resources", "methods"):
        blocks += [v.get("train") for v in (config.get(section) or {}).values() if isinstance(v, dict)]
    for block in blocks:
        for key, value in (block or {}).items() if isinstance(block, dict) else ():
            if isinstance(value, str) and _EXPONENT_NUMBER.fullmatch(value):
                block[key] = float(value)


def read_configs(paths) -> dict:
    """Workflow config files merged as `snakemake --configfile A B` merges them
    (snakemake.utils.update_config: a later file's mapping updates an earlier one's key by key, at
    every depth; any other value replaces). Not yet normalised nor validated."""
    from snakemake.utils import update_config

    from bfspo.io import read_yaml

    config: dict = {}
    for path in paths:
        try:
            one = read_yaml(path)
        except OSError as e:
            raise ConfigError([f"cannot read {path}: {e}"]) from None
        except BfspoError as e:
            raise ConfigError([str(e)]) from None
        if not isinstance(one, dict):
            raise ConfigError([f"{path}: a workflow config is a YAML mapping"])
        update_config(config, one)
    return config


def load_config(path: str | Path, schema: str | Path = SCHEMA) -> dict:
    """A workflow config file as the workflow reads it: YAML, numbers normalised, validated against
    the schema with its defaults filled in (`validate_config`, as workflow/rules/common.smk)."""
    config = read_configs([path])
    normalise_numbers(config)
    try:
        validate_config(config, schema)
    except SchemaError as e:
        raise ConfigError([f"{path}: {p}" for p in e.problems], e.footer) from None
    return config


def run_id(model: str, train_set: str, method: str, seed: int) -> str:
    return f"{model}_{train_set}_{method}_s{seed}"


def zero_shot_id(model: str) -> str:
    return f"{model}_{ZERO_SHOT}"


def alternation(names) -> str:
    """A regular expression (a wildcard constraint) matching exactly these names."""
    return "|".join(re.escape(n) for n in sorted(names)) or "(?!)"


def data_parallel_ranks(res: dict, tensor_parallel: int = 1) -> int:
    """Training processes per node: one per GPU (per tensor-parallel group of GPUs), each with its own
    rollout engine; a CPU class sets `ranks` itself (gloo), 1 by default."""
    return max(res["gpus"] // tensor_parallel, 1) if res["gpus"] else res.get("ranks", 1)


def reference_errors(config: dict) -> list[str]:
    """What the schema cannot check: names used by tables must exist, models' size classes and GPU
    counts must fit, sections that other keys need must be there, and the `slurm` keys
    (`slurm.problems`)."""
    errors = []
    results = config.get("results", "results")

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
        if not gpus and res.get("nodes", 1) > 1:
            errors.append(f"resources.{model['size']}.nodes: training across nodes is for GPU classes")
        if gpus and gpus * res.get("cpus_per_gpu", 1) < 2:
            errors.append(f"resources.{model['size']}.cpus_per_gpu: a GPU training job asks Slurm for 2 tasks "
                          "(bfspo/pipeline/jobs.py, job_resources), so gpus x cpus_per_gpu must be at least 2")
    toy_paths = [m["path"] for m in config["models"].values()] + [
        s["data"] for s in list(config["train_sets"].values()) + list(config["benchmarks"].values())
    ]
    if "stand_ins" in config and not config.get("train", {}).get("limit"):
        errors.append("stand_ins: the stand-ins are fine-tuned on the questions their runs train on, "
                      "so train.limit must set how many (the first N of every train set)")
    if "toy" not in config and any(p.startswith(f"{results}/toy") for p in toy_paths):
        errors.append("paths under results/toy... are built by the toy rules and need a 'toy' section")
    return errors + slurm.problems(config)


class Matrix:
    """The runs and tables of one validated workflow config (see the module doc)."""

    def __init__(self, config: dict):
        errors = reference_errors(config)
        if errors:
            raise ConfigError(errors)
        self.config = config
        self.results = config.get("results", "results")
        self.wandb = config["wandb"]
        self.evaluation = config.get("evaluation", {})
        self.data = {"raw_dir": "data/raw", "out_dir": f"{self.results}/data"} | config.get("data", {})
        self.runs = self._plan_runs()
        self.zero_shot_runs = self._plan_zero_shot()

    def _plan_runs(self) -> dict[str, dict]:
        """run id -> its spec, in table order; the first table that shows a run names its W&B group."""
        runs = {}
        for table, spec in self.config["tables"].items():
            train_sets = list(dict.fromkeys(c["train_set"] for c in spec["columns"]))
            for model in spec["models"]:
                for train_set in train_sets:
                    for method in spec["methods"]:
                        for seed in self.table_seeds(table):
                            runs.setdefault(
                                run_id(model, train_set, method, seed),
                                dict(model=model, train_set=train_set, method=method, seed=seed, table=table),
                            )
        return runs

    def _plan_zero_shot(self) -> dict[str, tuple[str, str]]:
        """zero-shot run id -> (model, the first table that shows it)."""
        out = {}
        for table, spec in self.config["tables"].items():
            for model in spec["models"]:
                out.setdefault(zero_shot_id(model), (model, table))
        return out

    # ---- runs and tables ------------------------------------------------------------------------

    def done(self, run: str) -> str:
        """The marker of a finished training run, written last (bfspo/training/trainer.py); a
        Snakemake pattern where `run` is a wildcard (`{run}`)."""
        return f"{self.results}/runs/{run}/done.json"

    def summary(self, run: str, benchmark: str) -> str:
        return f"{self.results}/eval/{run}/{benchmark}/summary.json"

    def table_seeds(self, table: str) -> list[int]:
        """The training seeds of a table's runs: its own `seeds`, or the config's."""
        return self.config["tables"][table].get("seeds", self.config["seeds"])

    def table_evaluations(self, table: str) -> list[tuple[str, str]]:
        """Every (run, benchmark) a table reads: zero-shot, then each method and seed, per column."""
        spec = self.config["tables"][table]
        pairs = []
        for model in spec["models"]:
            for col in spec["columns"]:
                pairs.append((zero_shot_id(model), col["benchmark"]))
                for method in spec["methods"]:
                    for seed in self.table_seeds(table):
                        pairs.append((run_id(model, col["train_set"], method, seed), col["benchmark"]))
        return list(dict.fromkeys(pairs))

    def evaluations(self) -> list[tuple[str, str]]:
        """Every (run, benchmark) evaluation of the DAG, each once, in table order."""
        return list(dict.fromkeys(pair for table in self.config["tables"] for pair in self.table_evaluations(table)))

    def table_summaries(self, table: str) -> list[str]:
        """Every evaluation summary a table reads (`table_evaluations`)."""
        return [self.summary(run, bench) for run, bench in self.table_evaluations(table)]

    def table_runs(self, table: str) -> list[str]:
        """The done.json markers of a table's training runs (figures read their metrics and trees)."""
        return [self.done(r) for r, spec in self.runs.items() if self._in_table(spec, table)]

    def tables_of(self, run: str) -> list[str]:
        """Every table that shows a training run, or, for a zero-shot run id, its model."""
        if run in self.runs:
            return [t for t in self.config["tables"] if self._in_table(self.runs[run], t)]
        return [t for t, spec in self.config["tables"].items() if self.zero_shot_runs[run][0] in spec["models"]]

    def _in_table(self, run: dict, table: str) -> bool:
        spec = self.config["tables"][table]
        return (
            run["model"] in spec["models"]
            and run["method"] in spec["methods"]
            and any(c["train_set"] == run["train_set"] for c in spec["columns"])
        )

    def group_of(self, run: str) -> str:
        """The W&B group of a training or zero-shot run: the first table that shows it."""
        return self.runs[run]["table"] if run in self.runs else self.zero_shot_runs[run][1]

    def table_spec(self, table: str) -> str:
        """What `bfspo tables` and `bfspo figures` need to lay out one table, as JSON."""
        cfg = self.config
        spec = cfg["tables"][table]
        return json.dumps(
            dict(
                name=table,
                title=spec["title"],
                layout=spec["layout"],
                models=[dict(key=m, label=cfg["models"][m]["label"]) for m in spec["models"]],
                methods=[
                    dict(
                        key=m,
                        label=cfg["methods"][m]["label"],
                        paper=cfg["methods"][m].get("paper"),
                        k=cfg["methods"][m]["k"],
                        selection=cfg["methods"][m].get("selection", "bfs"),
                        advantage=cfg["methods"][m].get("advantage", "branch"),
                        overlong=cfg["methods"][m].get("overlong", True),
                        color=cfg["methods"][m].get("color"),
                    )
                    for m in spec["methods"]
                ],
                columns=[
                    dict(
                        col,
                        label=cfg["benchmarks"][col["benchmark"]].get("label", col["benchmark"]),
                        train_label=cfg["train_sets"][col["train_set"]].get("label", col["train_set"]),
                    )
                    for col in spec["columns"]
                ],
                paper_tables=spec.get("paper_tables", []),
                reported=spec.get("reported"),
                contrasts=spec.get("contrasts"),
            ),
            separators=(",", ":"),
        )

    def final_outputs(self) -> list[str]:
        """The files the whole DAG ends in (rule all): each table's CSV/Markdown/LaTeX, figures and
        report, the AES consistency table, the rehearsal's check and the toy's hashes."""
        outputs = []
        for table in self.config["tables"]:
            outputs += [f"{self.results}/tables/{table}.{ext}" for ext in ("csv", "md", "tex")]
            outputs.append(f"{self.results}/figures/{table}")
            if self.wandb.get("report", True):
                outputs.append(f"{self.results}/report/{table}.json")
        if self.config.get("reported_results"):
            outputs.append(f"{self.results}/tables/aes_consistency.csv")
        if "stand_ins" in self.config:
            outputs.append(f"{self.results}/rehearsal_check.json")
        if "toy" in self.config:
            outputs.append(f"{self.config['toy']['model_dir']}.sha256")
        return outputs

    def closing_message(self, mode: str | None = None) -> str:
        """What the workflow prints when it succeeds (the Snakefile's `onsuccess`): each table that
        exists, its formats and its figures, and the command that uploads the W&B runs (for
        `mode`, the W&B mode the runs had: WANDB_MODE, else the config's)."""
        mode = mode or os.environ.get("WANDB_MODE") or self.wandb["mode"]
        lines = ["The workflow finished."]
        tables = [t for t in self.config["tables"] if Path(f"{self.results}/tables/{t}.md").is_file()]
        if tables:
            width = max(map(len, tables))
            lines.append(f"Tables (.md, .csv and .tex in {self.results}/tables/) and figures:")
            lines += [f"  {t:<{width}}  {self.results}/tables/{t}.md   {self.results}/figures/{t}/" for t in tables]
        rehearsal = " --rehearsal" if "stand_ins" in self.config else ""
        if mode == "offline":
            lines.append(f"W&B runs are offline under {self.results}/: `bfspo sync {self.results}{rehearsal}` uploads "
                         f"them (`bfspo sync {self.results}{rehearsal} --list` lists them).")
        elif mode == "online":
            lines.append(f"W&B runs were logged live to the project {self.wandb['project']}.")
        return "\n".join(lines)

    def reported_inputs(self) -> list[str]:
        return [self.config["reported_results"]] if self.config.get("reported_results") else []

    def reported_arg(self) -> str:
        reported = self.config.get("reported_results")
        return f"--reported {shlex.quote(reported)}" if reported else ""

    # ---- models ----------------------------------------------------------------------------------

    def model_of(self, run: str) -> str:
        """The model key of a training run or a zero-shot run id."""
        return self.runs[run]["model"] if run in self.runs else self.zero_shot_runs[run][0]

    def size_of(self, run: str) -> str:
        """The name of the size class of a run's (or a zero-shot run's) model."""
        return self.config["models"][self.model_of(run)]["size"]

    def size_class(self, run: str) -> dict:
        return self.config["resources"][self.size_of(run)]

    def stand_in_path(self, size: str) -> str:
        return f"{self.config['stand_ins']['dir']}/{size}"

    def stand_in_init_path(self, size: str) -> str:
        """The random-init step of a stand-in, before its SFT."""
        return f"{self.config['stand_ins']['dir']}/init/{size}"

    def toy_model_paths(self) -> list[str]:
        """The toy's start models: its model and the other starts (`toy.starts`, DIR/seedN)."""
        toy = self.config.get("toy")
        if toy is None:
            return []
        starts = toy.get("starts")
        return [toy["model_dir"]] + ([toy_start_path(starts["dir"], seed) for seed in starts["seeds"]] if starts else [])

    def built_model_paths(self) -> list[str]:
        """Model paths that this workflow builds (the toy's start models, the stand-ins)."""
        built = self.toy_model_paths()
        if "stand_ins" in self.config:
            built += [self.stand_in_path(size) for size in self.config["resources"]]
        return built

    def model_inputs(self, model: str) -> list[str]:
        """A model built by this workflow (the toy, a stand-in) is an input; a hub id or an outside path is not."""
        path = self.config["models"][model]["path"]
        return [path] if path in self.built_model_paths() else []

    def model_key(self, model: str) -> str:
        """A rule parameter that changes when a local model's files are replaced in place
        (bfspo.fingerprint.model_key: their sizes and modification times), so that Snakemake reruns
        the jobs of a model it cannot see as an input; each job then compares the content. "" for a
        model this workflow builds (an input already, rebuilt by its rule) and for a hub id."""
        from bfspo.fingerprint import model_key

        path = self.config["models"][model]["path"]
        return "" if path in self.built_model_paths() else model_key(path)

    def stand_in_data(self) -> tuple[list[str], int]:
        """What a stand-in's tokenizer and max positions cover: every train set and benchmark, as
        `BENCHMARK=FILE` (the benchmark whose prompt renders the file), and the largest budget."""
        cfg = self.config
        pairs = {f"{s['benchmark']}={s['data']}" for s in cfg["train_sets"].values()}
        pairs |= {f"{name}={b['data']}" for name, b in cfg["benchmarks"].items()}
        budget = max(s["budget"] for s in list(cfg["train_sets"].values()) + list(cfg["benchmarks"].values()))
        return sorted(pairs), budget


def toy_start_path(starts_dir: str, seed: int) -> str:
    """Where rule toy_start builds the toy's start model of SFT seed `seed` (`toy.starts`)."""
    return f"{starts_dir}/seed{seed}"


def toy_data_args(section: dict) -> str:
    """`bfspo toy data` split sizes and difficulty that a config section (`toy`, `toy.questions`)
    sets (the rest keep the CLI's defaults)."""
    keys = ("n_train", "n_rl", "n_eval", "max_value", "max_operand", "min_steps", "max_steps")
    return " ".join(f"--{k.replace('_', '-')} {shlex.quote(str(section[k]))}" for k in keys if k in section)
