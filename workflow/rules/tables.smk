"""Tables, figures and the W&B report run of each table, plus the AES consistency report."""


rule table:
    input:
        summaries=lambda wc: table_summaries(wc.table),
        runs=lambda wc: table_runs(wc.table),
        reported=reported_inputs(),
    output:
        multiext(f"{RESULTS}/tables/{{table}}", ".csv", ".md", ".tex"),
    log:
        "logs/tables/{table}.log",
    wildcard_constraints:
        table=TABLE_RE,
    params:
        spec=lambda wc: table_spec(wc.table),
        reported=reported_arg(),
        runs_dir=f"{RESULTS}/runs",
        out_dir=output_dir,
        owner=CONFIG_ID,
    resources:
        **slurm_resources(),
    conda:
        CONDA_ENV
    shell:
        "bfspo tables build --spec {params.spec:q} --summaries {input.summaries:q} {params.reported}"
        " --runs-dir {params.runs_dir:q} --out-dir {params.out_dir:q} --owner {params.owner:q} > {log:q} 2>&1"


rule aes_consistency:
    input:
        reported_inputs(),
    output:
        multiext(f"{RESULTS}/tables/aes_consistency", ".csv", ".md"),
    log:
        "logs/tables/aes_consistency.log",
    params:
        out_dir=output_dir,
    resources:
        **slurm_resources(),
    conda:
        CONDA_ENV
    shell:
        "bfspo tables consistency --reported {input:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule figures:
    input:
        summaries=lambda wc: table_summaries(wc.table),
        runs=lambda wc: table_runs(wc.table),
        reported=reported_inputs(),
    output:
        directory(f"{RESULTS}/figures/{{table}}"),
    log:
        "logs/figures/{table}.log",
    wildcard_constraints:
        table=TABLE_RE,
    params:
        spec=lambda wc: table_spec(wc.table),
        reported=reported_arg(),
        runs_dir=f"{RESULTS}/runs",
    resources:
        **slurm_resources(),
    conda:
        CONDA_ENV
    shell:
        "bfspo figures --spec {params.spec:q} --summaries {input.summaries:q} --runs-dir {params.runs_dir:q}"
        " {params.reported} --out-dir {output:q} > {log:q} 2>&1"


rule report:
    input:
        table=f"{RESULTS}/tables/{{table}}.csv",
        figures=f"{RESULTS}/figures/{{table}}",
    output:
        f"{RESULTS}/report/{{table}}.json",
    log:
        "logs/report/{table}.log",
    wildcard_constraints:
        table=TABLE_RE,
    params:
        project=WANDB["project"],
        group=lambda wc: wc.table,
        mode=WANDB["mode"],
        tags=" ".join(["--wandb-tags", *map(shlex.quote, WANDB["tags"])] if WANDB.get("tags") else []),
        wandb_dir=f"{RESULTS}/wandb",
    resources:
        **slurm_resources(),
    conda:
        CONDA_ENV
    shell:
        "bfspo report --project {params.project:q} --group {params.group:q} --mode {params.mode:q}"
        " --tables {input.table:q} --figures {input.figures:q} --wandb-dir {params.wandb_dir:q} {params.tags}"
        " --out {output:q} > {log:q} 2>&1"
