"""Training: one job per (model, train set, method, seed). The run directory persists between
attempts (checkpoints for resume); only done.json, written last, marks a finished run. A job that
hits its time limit is retried (`retries` in the Slurm profile) and resumes from its checkpoint.
A size class with several GPUs (or `ranks` on CPU) trains data-parallel under torchrun, across
`nodes` nodes with srun where it asks for more than one. The job's threads are shared out among
its ranks as torch threads (`--set threads=`, after the config's settings). A run of the toy's model
runs under the toy's pinned CPU numerics (`cpu_numerics`, an `env` prefix). The log is a link to
train.log in the run directory, which every attempt appends to (common.smk: logged_in_output_dir)."""

TRAIN_LOG = "logs/train/{run}.log"


rule train:
    input:
        data=lambda wc: config["train_sets"][RUNS[wc.run]["train_set"]]["data"],
        val_data=lambda wc: config["train_sets"][RUNS[wc.run]["train_set"]].get("val_data", []),
        model=lambda wc: model_inputs(RUNS[wc.run]["model"]),
    output:
        done("{run}"),
    log:
        TRAIN_LOG,
    benchmark:
        "benchmarks/train/{run}.tsv"
    wildcard_constraints:
        run=RUN_RE,
    params:
        numerics=cpu_numerics,
        model_key=lambda wc: MATRIX.model_key(RUNS[wc.run]["model"]),  # a local model replaced in place reruns the job
        out_dir=output_dir,
        log_link=logged_in_output_dir("train.log", TRAIN_LOG),
        settings=train_args,
        launcher=train_launcher,
        rank_threads=lambda wc, threads: jobs.process_threads(MATRIX, wc.run, "train", threads),  # torch threads of each rank
    threads: job_threads("train")
    resources:
        **job_resources("train"),
    conda:
        CONDA_ENV
    shell:
        "mkdir -p {params.out_dir:q} && ln -sfn {params.log_link:q} {log:q} && "
        "{params.numerics}{params.launcher} train --output-dir {params.out_dir:q} {params.settings} --set threads={params.rank_threads:q} "
        ">> {log:q} 2>&1"
