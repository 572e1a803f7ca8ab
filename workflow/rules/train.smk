"""Training: one job per (model, train set, method, seed). The run directory persists between
attempts (checkpoints for resume); only done.json, written last, marks a finished run. A job that
hits its time limit is retried (`retries` in the Slurm profile) and resumes from its checkpoint.
A size class with several GPUs (or `ranks` on CPU) trains data-parallel under torchrun, across
`nodes` nodes with srun where it asks for more than one."""


rule train:
    input:
        data=lambda wc: config["train_sets"][RUNS[wc.run]["train_set"]]["data"],
        model=lambda wc: model_inputs(RUNS[wc.run]["model"]),
    output:
        f"{RESULTS}/runs/{{run}}/done.json",
    log:
        "logs/train/{run}.log",
    benchmark:
        "benchmarks/train/{run}.tsv"
    wildcard_constraints:
        run=RUN_RE,
    params:
        out_dir=output_dir,
        settings=train_args,
        launcher=train_launcher,
    threads: job_threads("train")
    resources:
        **job_resources("train"),
    conda:
        CONDA_ENV
    shell:
        "{params.launcher} train --output-dir {params.out_dir:q} {params.settings} > {log} 2>&1"
