"""The one planning path of a workflow config: what Snakemake checks when it plans the DAG
(workflow/rules/common.smk) and what `bfspo plan` prints, so that the two give one verdict.

`plan(config, config_files)` runs every plan-time check in order:

1. the numbers normalised and the config validated against its schema (defaults filled in, in
   place, as the rules then read it);
2. the experiment matrix (`Matrix`: names the tables use, size classes, GPU counts, `slurm` keys);
3. what every job would refuse (bfspo/pipeline/preflight.py: each run's settings, each
   evaluation's protocol and budget, model paths);
4. tables that another config built in the same results folder (bfspo/reporting/owner.py);
5. the GPU plan of every job (bfspo/pipeline/gpu_plan.py) and the jobs that cannot run: a peak
   beyond the card, more attempts than the profile's retries, a time limit over the partition's
   (`slurm.max_runtime`);
6. the warnings (`Plan.warnings`): arms whose trees miss their chains per step, training runs
   with no attempt to spare, finished runs and evaluations made with other code
   (bfspo/pipeline/stale.py); and the line naming the Slurm keys left to the cluster.

A config that fails 1-3 stops there (nothing after can be planned); 4 and 5 are all reported.
`Plan.problems` holds the refusals, each after the config file's name; an empty list: the plan
runs. A new warning is one more call in `plan()`'s list of warnings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from bfspo.errors import BfspoError
from bfspo.pipeline import chains, gpu_plan, jobs, slurm, stale
from bfspo.pipeline.gpu_plan import Plans, TrainPlan, attempts_within, runtime_for_attempts
from bfspo.pipeline.matrix import Matrix, normalise_numbers
from bfspo.pipeline.preflight import plan_problems
from bfspo.pipeline.schema import SCHEMA, ConfigProblems, located, validate_config
from bfspo.reporting.owner import config_id, owner_problems


@dataclass
class Plan:
    """A planned workflow config: its matrix and job plans (None where a problem stopped the
    planning before them), its refusals, its warnings and the unset-Slurm-keys line."""

    source: str  # the config file(s), as typed, that every refusal names
    owner: str  # the config file(s) as a table's owner record names them (bfspo/reporting/owner.py)
    matrix: Matrix | None = None
    jobs: Plans | None = None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    unset: str | None = None

    @property
    def refusal(self) -> str:
        """Every problem, one after the other ("" when the plan runs)."""
        return "\n".join(self.problems)


def config_source(config_files) -> str:
    """The config files as typed: relative to the working directory where they are below it,
    joined by ' + ' ("the config" when there are none)."""
    def typed(path) -> str:
        relative = os.path.relpath(path)
        return str(path) if relative.startswith("..") else relative

    return " + ".join(map(typed, config_files)) or "the config"


def plan(config: dict, config_files, schema: str | Path = SCHEMA, gpu_mem_gb: float | None = None) -> Plan:
    """Every plan-time check of `config` (read from `config_files`), in the module's order; `config`
    is normalised and validated in place. gpu_mem_gb: plan every job for a card of that size."""
    out = Plan(source=config_source(config_files), owner=config_id(config_files))
    try:
        normalise_numbers(config)
        validate_config(config, schema)
        out.matrix = m = Matrix(config)
    except BfspoError as e:
        out.problems.append(located(e, out.source))
        return out
    preflight = plan_problems({r: jobs.train_settings(m, r) for r in m.runs}, evaluated(m), m.built_model_paths())
    if preflight:
        out.problems.append(located(ConfigProblems(preflight), out.source))
        return out
    owners = owner_problems(f"{m.results}/tables", config["tables"], out.owner)
    if owners:
        out.problems.append(located(BfspoError("\n".join(owners)), out.source))
    out.jobs = gpu_plan.plan_matrix(m, gpu_mem_gb=gpu_mem_gb)
    cannot = out.jobs.errors() + runtime_problems(m, out.jobs)
    if cannot:
        out.problems.append(located(BfspoError("jobs that cannot run (bfspo plan prints every term):\n  "
                                               + "\n  ".join(cannot)), out.source))
    out.warnings = [w for w in (
        chains.warning(chains.shortfalls(m)),
        spare_attempt_warning(m, out.jobs),
        stale.warning(m),
    ) if w]
    out.unset = slurm.unset_line(config, out.source)
    return out


def evaluated(m: Matrix) -> list[dict]:
    """Every evaluated (model, benchmark) of the tables, as preflight.plan_problems takes them."""
    config = m.config
    return [dict(config["benchmarks"][c["benchmark"]], benchmark=c["benchmark"], model=config["models"][model]["path"])
            for spec in config["tables"].values() for model in spec["models"] for c in spec["columns"]]


# ---- the partition's time limit and the attempts to spare --------------------------------------------


def max_runtime(m: Matrix, run: str, gpu_job: bool) -> tuple[int | None, str]:
    """The partition's time limit (min) of a job of `run`'s size class, and the key that sets it:
    `slurm.sizes.<class>.max_runtime`, else `slurm.cpu.max_runtime` for a CPU-only job, else
    `slurm.max_runtime` (None: no limit stated)."""
    size = m.size_of(run)
    s = m.config.get("slurm") or {}
    if "max_runtime" in ((s.get("sizes") or {}).get(size) or {}):
        key = f"slurm.sizes.{size}.max_runtime"
    elif not gpu_job and "max_runtime" in (s.get("cpu") or {}):
        key = "slurm.cpu.max_runtime"
    else:
        key = "slurm.max_runtime"
    return slurm.settings(m.config, gpu_job, size).get("max_runtime"), key


def runtime_problems(m: Matrix, plans: Plans) -> list[str]:
    """Every train and evaluate job whose time limit is over its partition's (`max_runtime`): sbatch
    would refuse it when it is submitted. Each names the job, its limit, the partition's and the key
    to lower."""
    out = []
    stages = [("train", run, None, plans.train.get(run)) for run in m.runs]
    stages += [("eval", run, bench, plans.eval.get((run, bench))) for run, bench in m.evaluations()]
    for stage, run, bench, p in stages:
        minutes = jobs.job_resources(m, run, stage, p)["runtime"]
        limit, key = max_runtime(m, run, jobs.gpus(m, run, stage) > 0)
        if limit is None or minutes <= limit:
            continue
        job = f"train {run}" if stage == "train" else f"evaluate {run} {bench}"
        fix = f"set resources.{m.size_of(run)}.{stage}_runtime to at most {limit}"
        if isinstance(p, TrainPlan):
            n = attempts_within(p.train_s, p.start_s, p.signal_s, limit)
            more = plans.max_attempts and n > plans.max_attempts
            fix += f" (then {n} attempts" + (f"; raise retries to {n}, one to spare)" if more else ")")
        out.append(f"{job}: time limit {minutes} min, over the partition's {limit} ({key}); {fix}")
    return out


def spare_attempt_warning(m: Matrix, plans: Plans) -> str:
    """The training runs that need every attempt the Slurm profile's retries give: one node failure
    or preemption and they fail. Names, per run, the time limit that leaves one to spare where the
    partition allows it ("" when every run has one)."""
    if not plans.max_attempts:
        return ""
    lines = []
    for run, p in plans.train.items():
        if p.attempts != plans.max_attempts:
            continue
        line = f"train {run}: {p.attempts} attempts of {p.runtime_min} min"
        if p.attempts > 1:
            minutes = runtime_for_attempts(p, p.attempts - 1)
            limit, key = max_runtime(m, run, True)
            line += (f"; resources.{m.size_of(run)}.train_runtime {minutes} would need {p.attempts - 1}"
                     if limit is None or minutes <= limit else f"; {minutes} min would need {p.attempts - 1}, over "
                     f"the partition's {limit} min ({key})")
        lines.append(line)
    if not lines:
        return ""
    return (f"Warning: these training runs need every one of the {plans.max_attempts} attempts that the Slurm "
            f"profile gives, so one node failure\nfails them. Give them one to spare: raise `retries` to "
            f"{plans.max_attempts} in slurm/config.yaml (or add --retries {plans.max_attempts} to the command), or "
            "the class's\ntrain_runtime as named, where the partition allows:\n  " + "\n  ".join(lines))
