"""The adapter between Snakemake and the planning: plan the config (bfspo/pipeline/plan.py), then hand
the rules bfspo/pipeline's answers (the experiment matrix, each job's settings, arguments, resources), which
tests import directly. Only what speaks Snakemake's language (wildcards, outputs, errors) is here.
"""

import atexit
import os
import shlex
import sys

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger

from bfspo.pipeline import jobs
from bfspo.pipeline.matrix import PREPARED_SPLITS, TOY_DATA_FILES, alternation as _alternation, toy_data_args, toy_start_path
from bfspo.pipeline.plan import plan
from bfspo.pipeline.schema import verbose

# Every plan-time check, as `bfspo plan` runs them (bfspo/pipeline/plan.py): the config validated
# (defaults filled in), the matrix, what every job would refuse, tables of another config, the GPU
# plan and the partition's time limit. A problem stops the plan, `snakemake -n` included.
PLAN = plan(config, workflow.configfiles, os.path.join(workflow.current_basedir, "..", "schemas", "config.schema.yaml"))
if PLAN.problems:
    if verbose():  # and Snakemake's report of where the workflow stopped (this file and line)
        raise WorkflowError(PLAN.refusal)
    sys.exit(PLAN.refusal)
for _warning in PLAN.warnings:
    logger.warning(_warning)
MATRIX, PLANS = PLAN.matrix, PLAN.jobs
CONFIG_ID = PLAN.owner  # the config files that the tables record as theirs (bfspo/reporting/owner.py)


def _submitting_dry_run():
    """A dry run of jobs that would be submitted (`--profile slurm -n`): Snakemake fills in default
    resources for a remote executor (the profile sets its own); a local dry run has none."""
    return workflow.dryrun and workflow.resource_settings.default_resources is not None


# Such a dry run ends saying which of partition and account are unset (printed when Snakemake exits).
if PLAN.unset:
    atexit.register(lambda: _submitting_dry_run() and print(PLAN.unset))

# Conda environment of every rule (`--sdm conda`); without it the rules use the active venv.
CONDA_ENV = "../envs/bfspo.yaml"

RESULTS = MATRIX.results
DATA = MATRIX.data
WANDB = MATRIX.wandb
RUNS = MATRIX.runs
RUN_RE = _alternation(RUNS)
EVAL_RUN_RE = _alternation(list(RUNS) + list(MATRIX.zero_shot_runs))
TABLE_RE = _alternation(config["tables"])

done = MATRIX.done
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
