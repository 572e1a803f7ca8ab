"""Checks of a workflow's planned jobs, made when Snakemake plans them (workflow/rules/common.smk), so
that a config that cannot work stops the plan, `snakemake -n` included, instead of failing in every
one of its jobs after they are submitted.

- Every planned training run's settings go through `config_from_values`, the TrainConfig validation
  that `bfspo train` itself runs (one source of truth): NaN, infinite or absurd values, a mini-batch
  that does not divide the batch, and the rest.
- Every evaluated benchmark's protocol goes through `check_protocol`, as `bfspo evaluate` checks it
  (several samples at temperature 0, a NaN temperature, ...).
- Every model path that the workflow does not build itself (the toy, a stand-in) must be a model
  folder or read as a hub id (`bfspo.model_source.local_problem`), whatever the size class: a
  typo in a path stops the plan, not the job. A hub id is not looked up here (that could mean
  the network); the job asks the hub once when it starts (`check_model_source`).
- Every budget is checked against the positions of the model it runs on, where that model is a local
  folder holding a config.json already. A hub id is not checked here (reading its config could mean
  a download), nor is a model the workflow builds itself: the job checks each prompt plus the
  budget when it loads the model.

Imports stay light (no torch): this runs in every Snakemake invocation.
"""

from __future__ import annotations

from pathlib import Path

from bfspo.errors import BfspoError
from bfspo.evaluation.protocol import check_protocol
from bfspo.io import read_json
from bfspo.model_source import local_problem
from bfspo.tasks.benchmarks import get_benchmark
from bfspo.training.config import config_from_values


def model_positions(model: str) -> int | None:
    """max_position_embeddings of a local model folder's config.json (None for a hub id, a folder not
    built yet, or a config without it)."""
    path = Path(model).expanduser() / "config.json"
    try:
        config = read_json(path)
    except (OSError, BfspoError):  # damaged: the GPU plan's reader names it (bfspo.pipeline.shapes)
        return None
    positions = config.get("max_position_embeddings")
    return positions if isinstance(positions, int) and not isinstance(positions, bool) else None


def _model_problem(model: str, built) -> str | None:
    return None if model in built else local_problem(model)


def _budget_problem(budget, model: str) -> str | None:
    positions = model_positions(model)
    if positions is not None and isinstance(budget, int) and budget >= positions:
        return (f"budget {budget} leaves no room for a prompt in the {positions} positions of model {model} "
                "(max_position_embeddings in its config.json)")
    return None


def plan_problems(runs: dict[str, dict], evaluations: list[dict], built: tuple[str, ...] | list[str] = ()) -> list[str]:
    """Every problem of the planned jobs, one line each, the runs or evaluations it concerns named
    (an empty list when the plan can run).

    runs: training run id -> its TrainConfig values (what `bfspo train --set` receives);
    evaluations: one dict per evaluated (model, benchmark): `model` (its path or hub id), `benchmark`,
    `budget`, and `samples` and `temperature` where the config sets them (else the benchmark's);
    built: the model paths that the workflow builds (absent until it has).
    """
    found: dict[str, list[str]] = {}  # problem -> where
    for run, values in runs.items():
        try:
            cfg = config_from_values(values)
        except BfspoError as e:
            found.setdefault(str(e), []).append(f"run {run}")
            continue
        problem = _model_problem(cfg.model, built) or _budget_problem(cfg.budget, cfg.model)
        if problem:
            found.setdefault(f"train: {problem}", []).append(f"run {run}")
    for ev in evaluations:
        where = f"benchmark {ev['benchmark']}"
        try:
            benchmark = get_benchmark(ev["benchmark"])
            check_protocol(ev["budget"], ev.get("samples", benchmark.samples),
                           ev.get("temperature", benchmark.temperature))
        except BfspoError as e:
            found.setdefault(f"evaluation: {e}", []).append(where)
            continue
        problem = _model_problem(ev["model"], built) or _budget_problem(ev["budget"], ev["model"])
        if problem:
            found.setdefault(f"evaluation: {problem}", []).append(where)
    return [f"{problem} ({', '.join(dict.fromkeys(where))})" for problem, where in found.items()]
