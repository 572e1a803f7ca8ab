"""What each train and evaluate job of the matrix runs and asks for: its trainer settings, its
command-line arguments, its launcher, its threads and its Slurm resources.

Functions of a `Matrix` and a run id (and a benchmark, for an evaluation); `stage` is "train" or
"eval". The rules call them through workflow/rules/common.smk.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from bfspo.pipeline import slurm
from bfspo.pipeline.matrix import ZERO_SHOT, Matrix, data_parallel_ranks
from bfspo.toy import numerics

STAGES = ("train", "eval")
# The Slurm profile (`snakemake --profile slurm`): its `retries` bound the attempts of a training
# run that needs several time limits (gpu_plan.Plans.errors), its `jobs` how many run at once.
PROFILE = Path(__file__).resolve().parents[2] / "slurm" / "config.yaml"


def profile_settings(profile: Path = PROFILE) -> dict | None:
    """The Slurm profile's settings (None: no profile at hand)."""
    if not profile.is_file():
        return None
    from bfspo.io import read_yaml

    return read_yaml(profile) or {}


def profile_attempts(profile: Path = PROFILE) -> int | None:
    """Attempts a job gets under the Slurm profile: its `retries` + 1 (None: no profile at hand)."""
    settings = profile_settings(profile)
    return None if settings is None else int(settings.get("retries", 0)) + 1


def profile_jobs(profile: Path = PROFILE) -> int | None:
    """Jobs the Slurm profile lets run at once, its `jobs` (None: no profile, or no limit set)."""
    settings = profile_settings(profile)
    return None if settings is None or settings.get("jobs") is None else int(settings["jobs"])


def gpus(m: Matrix, run: str, stage: str) -> int:
    """GPUs of one job: the class's `gpus` for training, `eval_gpus` (default 1 on a GPU class) for evaluation."""
    res = m.size_class(run)
    return res.get("eval_gpus", min(res["gpus"], 1)) if stage == "eval" else res["gpus"]


def ranks(m: Matrix, run: str) -> int:
    """Data-parallel training processes per node."""
    return data_parallel_ranks(m.size_class(run), m.config["models"][m.model_of(run)].get("tensor_parallel", 1))


def nodes(m: Matrix, run: str, stage: str) -> int:
    return m.size_class(run).get("nodes", 1) if stage == "train" else 1


def threads(m: Matrix, run: str, stage: str) -> int:
    """CPU threads of a job: GPUs x cpus_per_gpu on a GPU class; `cpus` (per rank) on a CPU class."""
    res = m.size_class(run)
    n = gpus(m, run, stage)
    if n:
        return n * res.get("cpus_per_gpu", 1)
    return res.get("cpus", 1) * (ranks(m, run) if stage == "train" else 1)


def process_threads(m: Matrix, run: str, stage: str, granted: int) -> int:
    """Torch threads of each process of a job (each training rank; the one evaluation process).

    On a GPU class, the class's `threads` (Slurm grants them: sbatch --cpus-per-gpu), whatever
    Snakemake's `granted` count says: a dry run (`snakemake -n`) caps every job's threads at
    --cores, 1 unless given, so the command it printed said `threads=1` where the submitted job
    runs 8. On a CPU class, the threads Snakemake granted (a local run's --cores caps them).
    Either way shared out among the training ranks."""
    total = threads(m, run, stage) if gpus(m, run, stage) else granted
    return max(1, total // (ranks(m, run) if stage == "train" else 1))


# The config's `evaluation` keys that become `bfspo evaluate` options (--batch-size ...).
EVAL_OPTIONS = ("engine", "batch_size", "limit", "gpu_memory_utilization", "max_num_seqs", "per_request_seeds")
SLURM_SIGNAL = "USR1"  # the trainer finishes its step, checkpoints and exits on it (bfspo/training/trainer.py)
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"  # torchrun's defaults, plus Slurm's warning


def train_launcher(m: Matrix, run: str, plan=None) -> str:
    """The command that starts `bfspo train` (the rule appends `train ...`).

    A CPU class: the plain entry point, or torchrun with `ranks` gloo ranks.

    A GPU class: torchrun with one rank per GPU (per tensor-parallel group) on each node, or the
    plain entry point for one rank, inside one Slurm job step that this command starts itself:
    `srun` with one task per node (the job asks the Slurm plugin for no step of its own, see
    `job_resources`), so that the step holds our processes only and Slurm's warning signal reaches
    them and nothing else. Outside Slurm (no SLURM_JOB_ID) the srun prefix expands to nothing. Across
    nodes torchrun meets at a c10d rendezvous on the job's first node. torchrun forwards the warning
    to its ranks and waits `plan.signal_s` for them to checkpoint.

    The job was submitted with `--ntasks` of at least 2 (`job_resources`: the plugin's MPI path), and
    Slurm exports that as SLURM_NTASKS, which srun reads as its own `--ntasks`: srun then refuses a
    step of 2 tasks on one node at one task per node. This works today because the plugin's job
    step (snakemake-executor-plugin-slurm-jobstep, `Executor.run_job`) runs the rule's command with
    every SLURM_* variable removed but the job's identity (SLURM_JOB_ID and a few others). The
    launcher does not rely on that: it passes `--ntasks` itself (srun's options win over its input
    variables), and it reads the job's nodes from squeue, not from SLURM_JOB_NODELIST, which the
    plugin removes too (tests/test_plan.py runs the launcher with and without those variables).
    """
    n_ranks, n_nodes = ranks(m, run), nodes(m, run, "train")
    if not gpus(m, run, "train"):
        return "bfspo" if n_ranks == 1 else f"torchrun --nproc-per-node {n_ranks} --standalone -m bfspo.cli"
    srun = (f"${{SLURM_JOB_ID:+srun --nodes {n_nodes} --ntasks {n_nodes} --ntasks-per-node 1 "
            f"--cpus-per-task {threads(m, run, 'train')} --kill-on-bad-exit=1}}")
    if n_ranks * n_nodes == 1:
        return f"{srun} bfspo"
    torchrun = f"torchrun --nproc-per-node {n_ranks} --signals-to-handle {TORCHRUN_SIGNALS}"
    if plan is not None:
        torchrun += f" --shutdown-timeout {plan.signal_s}"
    if n_nodes == 1:
        return f"{srun} {torchrun} --standalone -m bfspo.cli"
    head = "$(scontrol show hostnames \"$(squeue -h -j \"$SLURM_JOB_ID\" -o %N)\" | head -n 1)"
    return (f"{srun} {torchrun} --nnodes {n_nodes} --rdzv-backend c10d --rdzv-endpoint {head}:29500"
            f" --rdzv-id \"$SLURM_JOB_ID\" -m bfspo.cli")


def slurm_resources(m: Matrix, gpus: int = 0) -> dict:
    """The Slurm resources of a job of no size class (prepare, tables, figures, report, the toy's and
    the rehearsal's steps), only those set: partition, account, QOS, constraint, `slurm_extra`
    (config key `slurm`, bfspo/pipeline/slurm.py), and its GPUs if it has any."""
    res = slurm.resources(m.config, gpus > 0, gpus=gpus)
    return {k: v for k, v in res.items() if v is not None}


# The resources a train or evaluate job may set (`job_resources`; a job leaves out those that do not apply to it).
RESOURCE_NAMES = ("gpu", "gres", "nodes", "tasks_per_gpu", "cpus_per_gpu", "mem_mb", "runtime", "mpi", "tasks",
                  "slurm_extra", *slurm.RESOURCES.values())


def host_memory_mb(m: Matrix, run: str, stage: str) -> int:
    """Host memory of a job: the class's `mem_mb`, which is sized for a training job on all of its
    GPUs (each rank's vLLM offloads its weights to host memory while it sleeps); an evaluation on
    a GPU class asks for the share of its `eval_gpus`: mem_mb x eval_gpus / gpus."""
    res = m.size_class(run)
    if stage == "eval" and res["gpus"]:
        return res["mem_mb"] * gpus(m, run, "eval") // res["gpus"]
    return res["mem_mb"]


def job_resources(m: Matrix, run: str, stage: str, plan=None) -> dict:
    """Resources of a train or evaluate job, from its model's size class (a CPU class has gpus 0)
    and its GPU plan, if it has one (bfspo/pipeline/gpu_plan.py); None: not set.

    - `runtime`: the plan's time limit (`plan.runtime_min`), else the class's `<stage>_runtime`;
    - a GPU training job takes snakemake-executor-plugin-slurm's MPI path: with the `mpi`
      resource the plugin starts no `srun` of its own inside the job (its step would hold the
      job's Snakemake process, which Slurm's warning signal would kill), and the rule's launcher
      starts the one step (`train_launcher`). The plugin asks for at least 2 tasks there (`tasks`;
      our step runs one per node);
    - `slurm_extra`: `--signal=USR1@<plan.signal_s>` for a planned training job: Slurm signals
      every job step (not the batch shell, hence no `B:`) that long before the time limit; then the
      user's reservation and sbatch options;
    - GPUs: `gpu` (sbatch `--gpus`, which counts the whole job's GPUs) on one node; across nodes
      `gres: gpu:<gpus>`, which counts GPUs per node, so that every node gets its ranks' GPUs; with
      a `slurm.gpu_type`, `gres: gpu:<type>:<gpus>`;
    - partition, account, QOS, constraint: the config's `slurm` keys for a GPU (or CPU-only) job of
      the run's size class (bfspo/pipeline/slurm.py).
    """
    n = gpus(m, run, stage)
    res = m.size_class(run)
    n_nodes = nodes(m, run, stage)
    srun_step = stage == "train" and n > 0
    signal = [f"--signal={SLURM_SIGNAL}@{plan.signal_s}"] if srun_step and plan is not None else []
    return dict(
        nodes=n_nodes,
        tasks_per_gpu=0,  # no task per GPU: torchrun (in our srun step, on a GPU class) starts the ranks
        cpus_per_gpu=res.get("cpus_per_gpu", 0) if n else 0,
        mem_mb=host_memory_mb(m, run, stage),
        runtime=plan.runtime_min if plan is not None else res[f"{stage}_runtime"],
        mpi="srun" if srun_step else None,
        tasks=max(2, n_nodes) if srun_step else None,
        **slurm.resources(m.config, n > 0, m.size_of(run), n, n_nodes, signal),
    )


# ---- command-line arguments ------------------------------------------------------------------------


def cli_value(value) -> str:
    """A value as `bfspo train --set key=value` parses it (a YAML scalar, or a JSON list)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def device(m: Matrix, run: str, stage: str) -> str | None:
    """The `device` of a job: `cuda` on a GPU class (the job stops at once where CUDA is not usable,
    rather than run on the CPU until its time limit: bfspo/device.py); None (the default, `auto`)
    on a CPU class."""
    return "cuda" if gpus(m, run, stage) else None


def numerics_prefix(m: Matrix, run: str | None = None) -> str:
    """The `env ...` prefix of a job's command that pins its CPU numerics (bfspo/toy/numerics.py): on
    every job of the toy (its data, SFT and hash, with `run` None; the training and evaluation of its
    start models, unless `toy.numerics` is native), so that its bytes are the same on every x86-64 CPU
    with AVX2; "" on any other job."""
    toy = m.config.get("toy")
    if toy is None:
        return ""
    if run is not None and (toy.get("numerics", "pinned") == "native"
                            or m.config["models"][m.model_of(run)]["path"] not in m.toy_model_paths()):
        return ""
    return numerics.shell_prefix()


def train_settings(m: Matrix, run: str) -> dict:
    """Every TrainConfig field of one run that the workflow sets: the config's `train`, then its
    size class's, then its method's, then the run's own fields (`device` from its size class)."""
    cfg = m.config
    spec = m.runs[run]
    model = cfg["models"][spec["model"]]
    train_set = cfg["train_sets"][spec["train_set"]]
    method = cfg["methods"][spec["method"]]
    return (
        dict(cfg.get("train", {}))
        | m.size_class(run).get("train", {})
        | method.get("train", {})
        | {key: train_set[key] for key in ("val_data", "val_benchmark") if key in train_set}
        | ({"wandb_tags": m.wandb["tags"]} if m.wandb.get("tags") else {})
        | ({"device": device(m, run, "train")} if device(m, run, "train") else {})
        | dict(
            model=model["path"],
            train_data=train_set["data"],
            benchmark=train_set["benchmark"],
            budget=train_set["budget"],
            k=method["k"],
            selection=method.get("selection", "bfs"),
            advantage=method.get("advantage", "branch"),
            overlong=method.get("overlong", True),
            seed=spec["seed"],
            tensor_parallel_size=model.get("tensor_parallel", 1),
            wandb_project=m.wandb["project"],
            wandb_group=spec["table"],
            wandb_mode=m.wandb["mode"],
            run_name=run,
            method_key=spec["method"],
            model_label=model["label"],
            tables=m.tables_of(run),
        )
    )


def train_args(m: Matrix, run: str, plan=None) -> str:
    """`bfspo train --set key=value ...` of one run, quoted for the shell; with a GPU plan, the
    plan's checkpoint interval unless the config sets `save_every`."""
    settings = train_settings(m, run)
    if plan is not None:
        settings.setdefault("save_every", plan.save_every)
    return " ".join(f"--set {shlex.quote(f'{k}={cli_value(v)}')}" for k, v in settings.items())


def _tags(m: Matrix) -> list[str]:
    return ["--wandb-tags", *m.wandb["tags"]] if m.wandb.get("tags") else []


def sft_wandb_args(m: Matrix, name: str) -> str:
    """`--wandb-*` options of an SFT job (`bfspo toy build`, `bfspo stand-in-sft`): a W&B run called
    `name` in group `sft`, written to <results>/wandb/<name>; none when W&B is disabled."""
    if m.wandb["mode"] == "disabled":
        return ""
    args = ["--wandb-project", m.wandb["project"], "--wandb-group", "sft", "--wandb-mode", m.wandb["mode"],
            "--wandb-dir", f"{m.results}/wandb/{name}", "--run-name", name]
    return " ".join(shlex.quote(a) for a in args + _tags(m))


def eval_args(m: Matrix, run: str, bench: str) -> str:
    """`bfspo evaluate` options of one (run, benchmark): model, adapter, protocol, device, meta."""
    cfg, evaluation = m.config, m.evaluation
    model = m.model_of(run)
    b = cfg["benchmarks"][bench]
    args = ["--model", cfg["models"][model]["path"], "--benchmark", bench, "--data", b["data"], "--budget", b["budget"]]
    args += [x for key in ("samples", "temperature") if key in b for x in (f"--{key}", b[key])]
    args += [x for key in EVAL_OPTIONS if key in evaluation for x in (f"--{key.replace('_', '-')}", evaluation[key])]
    args += ["--seed", evaluation.get("seed", 0)]
    if device(m, run, "eval"):
        args += ["--device", device(m, run, "eval")]
    meta = dict(run=run, model=model, model_label=cfg["models"][model]["label"], method=ZERO_SHOT,
                tables=",".join(m.tables_of(run)))
    if run in m.runs:
        args += ["--adapter", f"{m.results}/runs/{run}/adapter"]
        meta |= dict(method=m.runs[run]["method"], train_set=m.runs[run]["train_set"], seed=m.runs[run]["seed"])
    if m.wandb["mode"] != "disabled":
        args += ["--wandb-project", m.wandb["project"], "--wandb-group", m.group_of(run), "--wandb-mode",
                 m.wandb["mode"], "--run-name", f"{run}_eval_{bench}"] + _tags(m)
    args += ["--meta"] + [f"{k}={v}" for k, v in meta.items()]
    return " ".join(shlex.quote(str(a)) for a in args)
