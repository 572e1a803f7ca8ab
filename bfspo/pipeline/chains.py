"""Chains per batch and per optimizer step of every arm (issue 36): can whole trees fill them?

A batch holds whole trees (bfspo/training/batching.py `select`), each rank filling its share, and an
optimizer step's mini-batch is cut from whole trees too (`minibatch_plan`). A tree of an arm holds
G (K + 1) chains once fully expanded, so the most chains whole trees reach of a target T is
floor(T / tree) * tree; a tree larger than T is taken alone, and reaches its own size. An arm whose
tree size does not divide its targets trains on fewer chains per step than the other arms of its
table: in the toy before issue 36, K = 2's trees of 24 chains filled 48 of its 64.

`shortfalls` names every arm, and each target of it, that whole trees cannot reach within TOLERANCE;
`snakemake -n` and `bfspo plan` print them as warnings (config/README.md, "Batch sizes").
"""

from __future__ import annotations

from dataclasses import dataclass

from bfspo.pipeline import gpu_plan, jobs
from bfspo.pipeline.matrix import Matrix

TOLERANCE = 0.05  # paper.yaml's K = 2 at G = 4: trees of 12 reach 504 of a mini-batch's 512 chains (-1.6%)


def reach(target: int, tree: int) -> int:
    """Chains that whole trees of `tree` chains fill of `target` (one tree alone if it is larger)."""
    return tree if tree > target else target // tree * tree


@dataclass(frozen=True)
class Shortfall:
    """An arm (a method of a model and train set) whose trees cannot reach one of its targets."""

    arm: str
    tables: tuple[str, ...]
    k: int
    group_size: int
    what: str  # "batch" or "optimizer step"
    target: int
    reached: int

    def __str__(self) -> str:
        tree = self.group_size * (self.k + 1)
        return (f"{', '.join(self.tables)}: arm {self.arm} (K = {self.k}, G = {self.group_size}): whole trees of "
                f"{tree} chains give {self.reached} chains per {self.what}, against a target of {self.target} "
                f"({self.reached / self.target:.0%})")


def reached(cfg, world: int) -> list[tuple[str, int, int]]:
    """(what, target chains, chains whole trees reach) of a TrainConfig trained by `world` ranks:
    the batch, whose every rank fills its share, and one optimizer step's mini-batch."""
    tree = cfg.chains_per_question
    return [("batch", cfg.train_batch_chains, world * reach(cfg.rank_chains(world), tree)),
            ("optimizer step", cfg.mini_batch_chains, reach(cfg.mini_batch_chains, tree))]


def warning(short: list[Shortfall]) -> str:
    """The warning that `snakemake -n` and `bfspo plan` print ("" when every arm reaches its targets)."""
    if not short:
        return ""
    return (f"Warning: whole trees cannot fill these arms' chains per batch or optimizer step within "
            f"{TOLERANCE:.0%}, so they train on other chains per step than their tables' other arms (choose "
            f"train_batch and mini_batch that G (K + 1) divides; config/README.md, \"Batch sizes\"):\n  "
            + "\n  ".join(map(str, short)))


def shortfalls(m: Matrix, tolerance: float = TOLERANCE) -> list[Shortfall]:
    """Every arm of the matrix, and each of its targets, that whole trees miss by more than
    `tolerance` of the target (one entry per arm, whatever its seeds)."""
    out, seen = [], set()
    for run, spec in m.runs.items():
        arm = f"{spec['model']}_{spec['train_set']}_{spec['method']}"
        if arm in seen:
            continue
        seen.add(arm)
        cfg = gpu_plan.train_config(m, run)
        world = jobs.ranks(m, run) * jobs.nodes(m, run, "train")
        for what, target, got in reached(cfg, world):
            if abs(got - target) > tolerance * target:
                out.append(Shortfall(arm, tuple(m.tables_of(run)), cfg.k, cfg.group_size, what, target, got))
    return out
