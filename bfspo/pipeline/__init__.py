"""The pipeline's planning: the experiment matrix of a workflow config and the GPU plan of its jobs.

The top layer: it reads a validated workflow config (a plain dict, as Snakemake hands it over) and
derives everything the rules need, with no Snakemake in it, so that tests import it directly and
`bfspo plan` prints what the rules will ask for. Nothing below it (training, evaluation, reporting,
rehearsal, toy) imports it.

- matrix.py: the runs, zero-shot runs and tables of a config, and the files the DAG ends in;
- jobs.py: per train / evaluate job: trainer settings, command-line arguments, launcher, resources;
- shapes.py: a model's shapes, from its config.json (shipped under config/models/ for hub models);
- memory.py, throughput.py: the memory terms and the time model, pure functions of the shapes;
- gpu_plan.py: one plan per job (peak memory, GPU-hours, checkpoint size, time limit, warning
  signal, checkpoint interval) and the refusal of a job that cannot fit its GPU;
- preflight.py: what every job would refuse, checked when the workflow is planned;
- schedule.py: the critical path of the planned jobs and the GPUs they hold at once;
- plan.py: the one planning path, every plan-time check in order (`plan`);
- cli.py: `bfspo plan`.

workflow/rules/common.smk is the adapter: it calls `plan.plan` as `bfspo plan` does, refuses what
it refuses, and hands the rules this package's answers.
"""
