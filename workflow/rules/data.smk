"""The real benchmarks: normalise data/raw into one JSONL per split."""


rule prepare:
    input:
        DATA["raw_dir"],
    output:
        expand("{out_dir}/{split}.jsonl", out_dir=DATA["out_dir"], split=PREPARED_SPLITS),
    log:
        "logs/prepare.log",
    params:
        out_dir=output_dir,
    resources:
        **slurm_resources(),
    conda:
        CONDA_ENV
    shell:
        "bfspo prepare --raw-dir {input:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"
