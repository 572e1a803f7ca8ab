"""`bfspo rehearsal-config`: the paper's whole DAG at a size that runs on 2 CPU cores.

    bfspo rehearsal-config --paper config/paper.yaml --out results/rehearsal/config.yaml [--engine transformers]

`derive` replaces only what this machine forces: each size class's hub models by one tiny
stand-in that the workflow builds (`stand_ins`: rule stand_in, random init, then rule stand_in_sft,
a short SFT on the training questions its runs then see), the step counts, the questions per
benchmark and per train set, and the batch sizes, and the resources (every class becomes a CPU class; a
class with several GPUs keeps that many data-parallel ranks). Its W&B runs go to a project of their
own, `<paper project>-rehearsal`, tagged `rehearsal`, so that they never mix with the paper's
(`bfspo sync` leaves them out unless asked with --rehearsal). Everything else (benchmarks, prompts,
budgets, samples, temperatures, methods, tables, reported rows, W&B groups and names) is the paper
config's own.
`--engine` may swap the rollout engine (CI uses transformers for speed). The tables' titles and a
README beside the config say that the numbers mean nothing.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import yaml

from bfspo.errors import BfspoError
from bfspo.io import atomic_write_text, read_yaml
from bfspo.tracking import REHEARSAL_SUFFIX, REHEARSAL_TAG

RESULTS = "results/rehearsal"
NOTE = "REHEARSAL: tiny stand-in models; the numbers mean nothing"
# One step of two prompts of 4 answers (two optimizer steps; one prompt per rank in a 2-rank class).
# Up to 4 rounds find groups that mix right and wrong answers (the SFT'd stand-in gets about 70%
# right on its 8 questions).
TRAIN_SIZE = dict(steps=1, limit=8, group_size=4, train_batch=2, mini_batch=1, oversample=2.0, max_gen_rounds=4,
                  threads=1, val_questions=2)
EVAL_LIMIT = 2
CPU_CLASS = dict(gpus=0, cpus=1, mem_mb=4000, train_runtime=60, eval_runtime=60)
README = f"""# {NOTE}

Everything under this folder comes from `make rehearsal`: the DAG of config/paper.yaml run end to end
with tiny stand-in models (models/, one per size class: random init, then a short SFT on the first
{TRAIN_SIZE['limit']} questions of each train set), {TRAIN_SIZE['steps']} training step(s) on those questions,
{EVAL_LIMIT} questions per benchmark and the smallest batches. It shows that every rule, prompt,
budget and table of the paper runs; its accuracies and lengths say nothing about BFS-PO.
config.yaml is the derived config (see bfspo/rehearsal/config.py for what it replaces).
"""


def _cpu_class(name: str, res: dict, models: dict) -> dict:
    """A CPU class with as many data-parallel ranks as the GPU class has GPUs (per tensor-parallel group)."""
    tps = {m.get("tensor_parallel", 1) for m in models.values() if m["size"] == name} or {1}
    ranks = (res["gpus"] * res.get("nodes", 1)) // max(tps) if res["gpus"] else res.get("ranks", 1)
    return CPU_CLASS | ({"ranks": ranks} if ranks > 1 else {})


def derive(paper: dict, engine: str | None = None) -> dict:
    """The rehearsal config of `paper`; `engine` (transformers or vllm) replaces the rollout engine."""
    if engine not in (None, "transformers", "vllm"):
        raise BfspoError(f"engine must be transformers or vllm, got {engine!r}")
    if "toy" in paper:
        raise BfspoError("the rehearsal derives from a config of hub models, not the toy's")
    out = copy.deepcopy(paper)
    out["results"] = RESULTS
    out["stand_ins"] = {"dir": f"{RESULTS}/models"}
    out["resources"] = {name: _cpu_class(name, res, paper["models"]) for name, res in paper["resources"].items()}
    out["models"] = {
        key: {k: v for k, v in m.items() if k != "tensor_parallel"} | {"path": f"{RESULTS}/models/{m['size']}"}
        for key, m in paper["models"].items()
    }
    out["train"] = paper.get("train", {}) | TRAIN_SIZE
    out["evaluation"] = paper.get("evaluation", {}) | {"limit": EVAL_LIMIT}
    out["wandb"] = paper["wandb"] | {"project": paper["wandb"]["project"] + REHEARSAL_SUFFIX,
                                     "tags": [*paper["wandb"].get("tags", []), REHEARSAL_TAG]}
    for method in out["methods"].values():  # a method's own sizes shrink too
        for key in TRAIN_SIZE.keys() & method.get("train", {}).keys():
            method["train"][key] = TRAIN_SIZE[key]
    if engine:
        out["train"]["engine"] = out["evaluation"]["engine"] = engine
    for spec in out["tables"].values():
        spec["title"] = f"{spec['title']} [{NOTE}]"
    return out


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--paper", type=Path, default=Path("config/paper.yaml"))
    parser.add_argument("--out", type=Path, default=Path(f"{RESULTS}/config.yaml"))
    parser.add_argument("--engine", choices=["transformers", "vllm"], help="rollout engine (default: the paper's)")


def run(args) -> int:
    try:
        paper = read_yaml(args.paper)
    except (OSError, BfspoError) as e:
        raise BfspoError(f"cannot read {args.paper}: {e}") from None
    config = derive(paper, args.engine)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    header = f"# {NOTE}.\n# Derived from {args.paper} by `bfspo rehearsal-config`; do not edit.\n"
    atomic_write_text(args.out, header + yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    atomic_write_text(args.out.parent / "README.md", README)
    print(f"rehearsal config -> {args.out}")
    return 0
