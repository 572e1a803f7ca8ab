"""Training: one job per (model, train set, method, seed). The run directory persists between
attempts (checkpoints for resume); only done.json, written last, marks a finished run."""


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
    threads: job_threads("train")
    resources:
        **job_resources("train"),
    conda:
        CONDA_ENV
    shell:
        "bfspo train --output-dir {params.out_dir:q} {params.settings} > {log} 2>&1"
