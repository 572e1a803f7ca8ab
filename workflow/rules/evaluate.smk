"""Evaluation: each trained run on every benchmark its tables show, and each model zero-shot
(run id <model>_zero-shot, no adapter) once per benchmark, with the job's threads as torch threads.
`bfspo evaluate` writes summary.json last. The toy's model is evaluated under its pinned CPU
numerics (`cpu_numerics`).
The log is a link to evaluate.log in the output folder, which every attempt appends to."""

EVAL_LOG = "logs/eval/{run}/{benchmark}.log"


rule evaluate:
    input:
        data=lambda wc: config["benchmarks"][wc.benchmark]["data"],
        model=lambda wc: model_inputs(model_of(wc.run)),
        run=lambda wc: [done(wc.run)] if wc.run in RUNS else [],
    output:
        summary("{run}", "{benchmark}"),
    log:
        EVAL_LOG,
    benchmark:
        "benchmarks/eval/{run}/{benchmark}.tsv"
    wildcard_constraints:
        run=EVAL_RUN_RE,
        benchmark="[^/]+",
    params:
        numerics=cpu_numerics,
        model_key=lambda wc: MATRIX.model_key(model_of(wc.run)),  # a local model replaced in place reruns the job
        out_dir=output_dir,
        log_link=logged_in_output_dir("evaluate.log", EVAL_LOG),
        args=eval_args,
        threads=lambda wc, threads: jobs.process_threads(MATRIX, wc.run, "eval", threads),
    threads: job_threads("eval")
    resources:
        **job_resources("eval"),
    conda:
        CONDA_ENV
    shell:
        "mkdir -p {params.out_dir:q} && ln -sfn {params.log_link:q} {log:q} && "
        "{params.numerics}bfspo evaluate {params.args} --threads {params.threads:q} --out-dir {params.out_dir:q} >> {log:q} 2>&1"
