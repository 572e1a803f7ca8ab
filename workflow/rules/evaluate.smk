"""Evaluation: each trained run on every benchmark its tables show, and each model zero-shot
(run id <model>_zero-shot, no adapter) once per benchmark. `bfspo evaluate` writes summary.json last."""


rule evaluate:
    input:
        data=lambda wc: config["benchmarks"][wc.benchmark]["data"],
        model=lambda wc: model_inputs(model_of(wc.run)),
        run=lambda wc: [f"{RESULTS}/runs/{wc.run}/done.json"] if wc.run in RUNS else [],
    output:
        summary("{run}", "{benchmark}"),
    log:
        "logs/eval/{run}/{benchmark}.log",
    benchmark:
        "benchmarks/eval/{run}/{benchmark}.tsv"
    wildcard_constraints:
        run=EVAL_RUN_RE,
        benchmark="[^/]+",
    params:
        out_dir=output_dir,
        args=eval_args,
    threads: job_threads("eval")
    resources:
        **job_resources("eval"),
    conda:
        CONDA_ENV
    shell:
        "bfspo evaluate {params.args} --out-dir {params.out_dir:q} > {log} 2>&1"
