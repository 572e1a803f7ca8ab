"""The adapter between Snakemake and the planning: validate the config, then hand it to
bfspo/pipeline (the experiment matrix, and each job's settings, arguments and resources), which
tests import directly. Only what speaks Snakemake's language (wildcards, outputs, errors) is here.
"""

import atexit
import os
import shlex
import sys

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger

from bfspo.errors import BfspoError
from bfspo.pipeline import chains, gpu_plan, jobs, slurm, stale
from bfspo.pipeline.matrix import (
    PREPARED_SPLITS,
    TOY_DATA_FILES,
    Matrix,
    alternation as _alternation,
    normalise_numbers,
    toy_data_args,
)
from bfspo.pipeline.schema import ConfigProblems, located, validate_config, verbose
from bfspo.preflight import plan_problems
from bfspo.reporting.owner import config_id, owner_problems


def _as_typed(path):
    """A config file's path relative to the working directory (`config/paper.yaml`) where it is below it."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


# The config files, as typed, that every refusal of the config and the unset-partition line name.
CONFIG_SOURCE = " + ".join(map(_as_typed, workflow.configfiles)) or "the config"


def refuse(error):
    """Stop the plan: the problems, each after the config file's name. Snakemake's report of where
    the workflow stopped (this file and line) only under BFSPO_VERBOSE=1."""
    message = located(error, CONFIG_SOURCE)
    if verbose():
        raise WorkflowError(message) from None
    sys.exit(message)


normalise_numbers(config)
try:
    validate_config(config, os.path.join(workflow.current_basedir, "..", "schemas", "config.schema.yaml"))
    MATRIX = Matrix(config)
except BfspoError as e:
    refuse(e)

# Conda environment of every rule (`--sdm conda`); without it the rules use the active venv.
CONDA_ENV = "../envs/bfspo.yaml"

RESULTS = MATRIX.results
DATA = MATRIX.data
WANDB = MATRIX.wandb
RUNS = MATRIX.runs
RUN_RE = _alternation(RUNS)
EVAL_RUN_RE = _alternation(list(RUNS) + list(MATRIX.zero_shot_runs))
TABLE_RE = _alternation(config["tables"])

# Refuse at plan time what every job would refuse: each run's settings (through TrainConfig), each
# evaluation's protocol and budget, and a model path that names no model folder (bfspo/preflight.py).
_PROBLEMS = plan_problems({r: jobs.train_settings(MATRIX, r) for r in RUNS}, [
    dict(config["benchmarks"][c["benchmark"]], benchmark=c["benchmark"], model=config["models"][m]["path"])
    for spec in config["tables"].values() for m in spec["models"] for c in spec["columns"]],
    MATRIX.built_model_paths())
if _PROBLEMS:
    refuse(ConfigProblems(_PROBLEMS))
# A table that another config built in the same results folder is refused, not overwritten.
CONFIG_ID = config_id(workflow.configfiles)
_OWNERS = owner_problems(f"{RESULTS}/tables", config["tables"], CONFIG_ID)
if _OWNERS:
    refuse(BfspoError("\n".join(_OWNERS)))
try:
    PLANS = gpu_plan.plan_matrix(MATRIX)  # peak memory and time of every GPU job (`bfspo plan` prints them)
    gpu_plan.check(MATRIX, PLANS)
except BfspoError as e:
    refuse(e)


def _submitting_dry_run():
    """A dry run of jobs that would be submitted (`--profile slurm -n`): Snakemake fills in default
    resources for a remote executor (the profile sets its own); a local dry run has none."""
    return workflow.dryrun and workflow.resource_settings.default_resources is not None


# Such a dry run ends saying which of partition and account are unset (printed when Snakemake exits).
_UNSET = slurm.unset_line(config, CONFIG_SOURCE)
if _UNSET:
    atexit.register(lambda: _submitting_dry_run() and print(_UNSET))

# An arm whose whole trees cannot fill its chains per batch or optimizer step is named, not refused.
_CHAINS = chains.warning(chains.shortfalls(MATRIX))
if _CHAINS:
    logger.warning(_CHAINS)
stale.warn(MATRIX, logger.warning)  # finished runs made with other code than the checkout's: named, not rerun

summary = MATRIX.summary
table_summaries = MATRIX.table_summaries
table_runs = MATRIX.table_runs
table_spec = MATRIX.table_spec
final_outputs = MATRIX.final_outputs
reported_inputs = MATRIX.reported_inputs
reported_arg = MATRIX.reported_arg
model_of = MATRIX.model_of
model_inputs = MATRIX.model_inputs
stand_in_path = MATRIX.stand_in_path
stand_in_init_path = MATRIX.stand_in_init_path
stand_in_data = MATRIX.stand_in_data


# ---- params and resources of the rules (functions of a job's wildcards) ----------------------


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


def cpu_numerics(wildcards):
    """The `env` prefix that pins the CPU numerics of a toy job ("" on a job of another model)."""
    return jobs.numerics_prefix(MATRIX, getattr(wildcards, "run", None))


def slurm_resources(gpus=0):
    """The Slurm resources (partition, account, QOS, ...) of a job of no size class, with `gpus` GPUs."""
    return jobs.slurm_resources(MATRIX, gpus)


def _plan(wildcards, stage):
    if stage == "eval":
        return PLANS.eval.get((wildcards.run, wildcards.benchmark))
    return PLANS.train.get(wildcards.run)


def job_resources(stage):
    """Resources of a train or evaluate job, from its model's size class and its GPU plan
    (bfspo/pipeline/jobs.py); a resource that does not apply to a job is None, which leaves it out."""
    return {
        name: (lambda wc, name=name: jobs.job_resources(MATRIX, wc.run, stage, _plan(wc, stage))[name])
        for name in jobs.RESOURCE_NAMES
    }


def job_threads(stage):
    return lambda wc: jobs.threads(MATRIX, wc.run, stage)


def train_launcher(wildcards):
    return jobs.train_launcher(MATRIX, wildcards.run, _plan(wildcards, "train"))


def train_args(wildcards):
    return jobs.train_args(MATRIX, wildcards.run, _plan(wildcards, "train"))


def eval_args(wildcards):
    return jobs.eval_args(MATRIX, wildcards.run, wildcards.benchmark)


def sft_wandb_args(name):
    return jobs.sft_wandb_args(MATRIX, name)
