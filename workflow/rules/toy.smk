"""The embedded toy (issue 6): generate the task, then build and SFT its tiny reasoning model (or,
where `toy.shipped` names a shipped start model and `toy.build` is not true, copy that one: issue
44, bfspo/toy/shipped.py); hash both and say whether they equal `toy.record` (issue 24; a mismatch
is printed, not a failure) and which start model the run used; and,
where `toy.questions` asks for them, other RL and evaluation questions for the same model (harder
ones, none of them an SFT question); and, where `toy.starts` asks for them, other start models: the
same SFT at other seeds (rule toy_start). Every toy job, these and the training and evaluation of the
toy's model, runs under the pinned CPU numerics of bfspo/toy/numerics.py (`cpu_numerics`)."""

if "toy" in config:
    TOY = config["toy"]

    rule toy_data:
        output:
            expand("{dir}/{name}.jsonl", dir=TOY["data_dir"], name=TOY_DATA_FILES),
        log:
            "logs/toy/data.log",
        params:
            numerics=cpu_numerics,
            out_dir=output_dir,
            seed=TOY["seed"],
            sizes=toy_data_args(TOY),
        resources:
            **slurm_resources(),
        conda:
            CONDA_ENV
        shell:
            "{params.numerics}bfspo toy data --out-dir {params.out_dir:q} --seed {params.seed:q} {params.sizes} > {log:q} 2>&1"

    if "shipped" in TOY and not TOY.get("build", False):

        rule toy_model:
            input:
                f"{TOY['shipped']}/PROVENANCE.sha256",
                f"{TOY['shipped']}/model.safetensors",
            output:
                directory(TOY["model_dir"]),
            log:
                "logs/toy/model.log",
            params:
                numerics=cpu_numerics,
                shipped=lambda wc, input: os.path.dirname(input[0]),
                size=TOY["size"],
            resources:
                **slurm_resources(),
            conda:
                CONDA_ENV
            shell:
                "{params.numerics}bfspo toy install --shipped {params.shipped:q} --out-dir {output:q} --size {params.size:q} > {log:q} 2>&1"

    else:

        rule toy_model:
            input:
                f"{TOY['data_dir']}/train.jsonl",
            output:
                directory(TOY["model_dir"]),
            log:
                "logs/toy/model.log",
            benchmark:
                "benchmarks/toy/model.tsv"
            params:
                numerics=cpu_numerics,
                size=TOY["size"],
                wandb=sft_wandb_args(f"sft-{Path(TOY['model_dir']).parent.name}"),
            # The model's bytes depend on the SFT's thread count, so the SFT sets its own (SFTConfig.threads,
            # 1 thread): never taken from --cores, the same on every machine, and unhurt by shared cores.
            threads: 1
            resources:
                **slurm_resources(TOY.get("gpus", 0)),
            conda:
                CONDA_ENV
            shell:
                "{params.numerics}bfspo toy build --train {input:q} --out-dir {output:q} --size {params.size:q} {params.wandb} > {log:q} 2>&1"

    if "starts" in TOY:

        rule toy_start:
            input:
                f"{TOY['data_dir']}/train.jsonl",
            output:
                directory(toy_start_path(TOY["starts"]["dir"], "{seed}")),
            log:
                "logs/toy/start-seed{seed}.log",
            benchmark:
                "benchmarks/toy/start-seed{seed}.tsv"
            wildcard_constraints:
                seed=r"\d+",
            params:
                numerics=cpu_numerics,
                size=TOY["size"],
                wandb=lambda wc: sft_wandb_args(f"sft-start-seed{wc.seed}"),
            threads: 1
            resources:
                **slurm_resources(TOY.get("gpus", 0)),
            conda:
                CONDA_ENV
            shell:
                "{params.numerics}bfspo toy build --train {input:q} --out-dir {output:q} --size {params.size:q}"
                " --seed {wildcards.seed:q} {params.wandb} > {log:q} 2>&1"

    rule toy_check:
        input:
            data=expand("{dir}/{name}.jsonl", dir=TOY["data_dir"], name=TOY_DATA_FILES),
            model=TOY["model_dir"],
            record=TOY.get("record", []),
        output:
            f"{TOY['model_dir']}.sha256",
        log:
            "logs/toy/check.log",
        params:
            numerics=cpu_numerics,
            data_dir=lambda wc, input: os.path.dirname(input.data[0]),
            record=lambda wc, input: f"--record {shlex.quote(input.record)}" if "record" in TOY else "",
        resources:
            **slurm_resources(),
        conda:
            CONDA_ENV
        shell:
            "{params.numerics}bfspo toy hash --model-dir {input.model:q} --data-dir {params.data_dir:q} --out {output:q}"
            " {params.record} 2>&1 | tee {log:q}"

    if "questions" in TOY:

        rule toy_questions:
            input:
                f"{TOY['data_dir']}/train.jsonl",
            output:
                expand("{dir}/{name}.jsonl", dir=TOY["questions"]["data_dir"], name=TOY_DATA_FILES),
            log:
                "logs/toy/questions.log",
            params:
                numerics=cpu_numerics,
                out_dir=output_dir,
                seed=TOY["questions"].get("seed", TOY["seed"]),
                knobs=toy_data_args(TOY["questions"]),
            resources:
                **slurm_resources(),
            conda:
                CONDA_ENV
            shell:
                "{params.numerics}bfspo toy data --out-dir {params.out_dir:q} --seed {params.seed:q} --n-train 1 {params.knobs}"
                " --exclude {input:q} > {log:q} 2>&1"

