"""Stand-in models (the rehearsal, bfspo/rehearsal.py): one tiny random-init Qwen2 per size class,
with a BPE tokenizer trained on the prepared questions and room for the longest prompt plus budget."""

if "stand_ins" in config:
    STAND_IN_DATA, STAND_IN_BUDGET = stand_in_data()

    rule stand_in:
        input:
            sorted({pair.split("=", 1)[1] for pair in STAND_IN_DATA}),
        output:
            directory(stand_in_path("{size}")),
        log:
            "logs/stand_in/{size}.log",
        wildcard_constraints:
            size=_alternation(config["resources"]),
        params:
            data=" ".join(shlex.quote(pair) for pair in STAND_IN_DATA),
            budget=STAND_IN_BUDGET,
            seed=lambda wc: list(config["resources"]).index(wc.size),
        resources:
            **slurm_resources(),
        conda:
            CONDA_ENV
        shell:
            "bfspo stand-in --data {params.data} --budget {params.budget} --seed {params.seed}"
            " --out-dir {output:q} > {log} 2>&1"
