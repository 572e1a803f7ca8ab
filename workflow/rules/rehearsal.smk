"""The rehearsal's own rules (bfspo/rehearsal/), planned where the config has `stand_ins`. Two steps
per size class build its stand-in model: a tiny random-init Qwen2 with a BPE tokenizer trained on
the prepared questions and room for the longest prompt plus budget (rule stand_in), then a short
SFT on the first `train.limit` questions of every train set, the ones its runs train on, so that
its groups mix right and wrong answers (rule stand_in_sft). Rule rehearsal_check, last, checks
that every table has a number in each cell of ours and that every run made an optimizer step."""

if "stand_ins" in config:
    STAND_IN_DATA, STAND_IN_BUDGET = stand_in_data()

    rule stand_in:
        input:
            sorted({pair.split("=", 1)[1] for pair in STAND_IN_DATA}),
        output:
            directory(stand_in_init_path("{size}")),
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
            "bfspo stand-in --data {params.data} --budget {params.budget:q} --seed {params.seed:q}"
            " --out-dir {output:q} > {log:q} 2>&1"

    rule stand_in_sft:
        input:
            model=stand_in_init_path("{size}"),
            data=sorted({s["data"] for s in config["train_sets"].values()}),
        output:
            directory(stand_in_path("{size}")),
        log:
            "logs/stand_in_sft/{size}.log",
        wildcard_constraints:
            size=_alternation(config["resources"]),
        params:
            data=" ".join(shlex.quote(f"{s['benchmark']}={s['data']}") for s in config["train_sets"].values()),
            questions=config["train"]["limit"],
            wandb=lambda wc: sft_wandb_args(f"sft-stand-in-{wc.size}"),
        resources:
            **slurm_resources(),
        conda:
            CONDA_ENV
        shell:
            "bfspo stand-in-sft --model {input.model:q} --data {params.data} --questions {params.questions:q}"
            " --out-dir {output:q} {params.wandb} > {log:q} 2>&1"

    rule rehearsal_check:
        input:
            tables=expand(f"{RESULTS}/tables/{{table}}.{{ext}}", table=config["tables"], ext=["csv", "md"]),
            runs=[done(run) for run in RUNS],
        output:
            f"{RESULTS}/rehearsal_check.json",
        log:
            "logs/rehearsal_check.log",
        params:
            tables=" ".join(shlex.quote(f"{RESULTS}/tables/{t}.csv") for t in config["tables"]),
            runs=" ".join(shlex.quote(f"{RESULTS}/runs/{r}") for r in RUNS),
        resources:
            **slurm_resources(),
        conda:
            CONDA_ENV
        shell:
            "bfspo rehearsal-check --tables {params.tables} --runs {params.runs} --out {output:q} > {log:q} 2>&1"
            " && cat {log:q}"
