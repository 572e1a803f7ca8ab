"""`bfspo plan`: the GPU plan of every train and evaluate job of a workflow config, as a table.

    bfspo plan --config config/paper.yaml                   # as the config's size classes say
    bfspo plan --config config/paper.yaml config/site.yaml  # merged as snakemake --configfile A B
    bfspo plan --config config/paper.yaml --gpu-mem-gb 40   # every job against a 40 GB card
    bfspo plan --config config/paper.yaml --verbose         # and every job's terms, one line each

One row per job, grouped by the paper table that first shows it (a job shared with an earlier table
is counted there): its GPUs, its peak memory per GPU and the phase that peaks, its time, the time
limit the rule asks Slurm for (x the attempts it needs), its GPU-hours, its host memory and its
partition; a subtotal per table, then the total against the paper's 96 (GSM8K) and 192 (MATH)
GPU-hours per BFS-PO run. With --verbose, first the throughput assumptions and each job's line:
its peak memory term by term, in the phase that peaks (the update with vLLM asleep, or the
rescoring forward with vLLM awake; the update with vLLM resident alongside; under the transformers
engine, the update or the engine's decode), the activations with and without gradient
checkpointing, vLLM's share (weights and KV cache), the time per step, the checkpoint size and
interval, and the warning signal. After the totals, the critical path (hours,
along the DAG's dependencies) and the peak of GPUs held at once at the Slurm profile's `jobs`.
The checks are Snakemake's own (bfspo/pipeline/plan.py): a config that it refuses exits with
status 1 here (2 where nothing can be planned), the refusal printed as Snakemake prints it, and
its warnings are printed too. The last line says which of the Slurm partition and account the
config leaves to the cluster.
"""

from __future__ import annotations

import argparse

from bfspo.errors import BfspoError
from bfspo.pipeline import jobs, schedule, slurm
from bfspo.pipeline.gpu_plan import (
    CHECKPOINT_BYTES_S,
    CUDA_CONTEXT,
    HEAD_CHUNK_ROWS,
    SAFETY,
    VLLM_ASLEEP,
    EvalPlan,
    TrainPlan,
    largest_micro_batch,
)
from bfspo.pipeline.matrix import Matrix, read_configs
from bfspo.pipeline.memory import GIB
from bfspo.pipeline.plan import plan
from bfspo.pipeline.throughput import ASSUMPTIONS

# The paper's compute per BFS-PO run (App. C: 8 A100s for 12 h on GSM8K, 24 h on MATH), by train set.
PAPER_GPU_HOURS = {"gsm8k": 96, "math": 192}


def g(x: float) -> str:
    return f"{x / GIB:.1f}"


def assumptions_text() -> str:
    a = ASSUMPTIONS
    hw = a.hardware
    return "\n".join([
        "Assumptions (bfspo/pipeline/throughput.py, gpu_plan.py; bench/gpu/gpu_session.sh measures them):",
        f"  GPU {hw.name}: {hw.flops / 1e12:.0f} TFLOP/s bf16, {hw.bandwidth / 1e12:.2f} TB/s; weights and "
        f"activations in bfloat16, LoRA and AdamW in float32",
        f"  training: 2N FLOPs/token for the rescoring forward (old log-probs, entropies) of every generated "
        f"tree, 6N (4N without checkpointing) for the update of the kept ones, at {a.train_mfu:.0%} MFU",
        f"  decoding (vLLM): roofline of a decode step at {a.decode_bandwidth:.0%} of HBM bandwidth and "
        f"{a.decode_mfu:.0%} MFU, concurrency min(max_num_seqs, what the KV cache holds)",
        f"  groups with signal 1 - p^n - (1 - p)^n (n = G, or G (K + 1) leaves under filter all_leaves), per-sample "
        f"accuracy p {', '.join(f'{k} {v:.3f}' for k, v in a.sample_accuracy)}; under first_samples only the trees "
        f"that pass are expanded; dynamic sampling asks (sampling: keep_rate) 1 / the keep rate the run estimates, "
        f"{a.keep_rate_estimate:g} x those groups' share, within 1x and oversample (sampling: fixed: oversample), "
        f"and a round fills what its keep rate leaves; an expansion regenerates {a.expansion_share:.0%} of a chain; "
        f"answers {', '.join(f'{k} {v:.2f}' for k, v in a.answer_fraction)} x budget",
        f"  served LoRA adapters decode {a.lora_decode_overhead:.0%} slower; each engine call (K + 1 waves per "
        f"generation round, one per evaluation batch) ends with a tail of (budget - mean answer) decode steps at "
        f"half its concurrency; vLLM preempts and recomputes, half-way, the share of max_num_seqs whose KV does "
        f"not fit",
        f"  {a.job_start_s:.0f} s to start a job, + {a.engine_start_s:.0f} s for vLLM's engine, + {a.compile_graph_s:.0f} s "
        f"per flex attention graph a training attempt compiles (a forward and a backward per bucket length the "
        f"update's rows meet, a forward per the rescoring's; answers' lengths spread {a.answer_cv:.0%}); the "
        f"rescoring's groups share rows, each padded half a bucket; {a.step_overhead_s:.0f} s per step; "
        f"checkpoints written at "
        f"{CHECKPOINT_BYTES_S / 1e6:.0f} MB/s; time limits and warning = plan x {SAFETY}",
        f"  CUDA context {g(CUDA_CONTEXT)} GiB per process; a sleeping vLLM keeps {g(VLLM_ASLEEP)} GiB; the head "
        f"runs {HEAD_CHUNK_ROWS} rows at a time",
    ])


def _terms(terms: dict) -> str:
    return " + ".join(f"{k} {g(v)}" for k, v in terms.items())


def train_line(p: TrainPlan) -> str:
    vllm = (f" | vLLM {g(p.vllm_total)} = weights {g(p.vllm_weights)} + KV {g(p.vllm_kv)} + workspace "
            f"{g(p.vllm_total - p.vllm_weights - p.vllm_kv)}, {p.concurrency:.0f} seqs" if p.vllm else "")
    return (f"train {p.run}: {p.gpus * p.nodes} GPU | peak {g(p.memory.peak)}/{g(p.gpu_mem)} GiB ({p.memory.phase}) = "
            f"{_terms(p.memory.terms)} | update: vLLM asleep {g(p.peak_asleep)}, resident {g(p.peak_resident)}; "
            f"activations@{p.micro_batch_tokens} {g(p.activations_checkpointed)} checkpointed, "
            f"{g(p.activations_full)} not{vllm} | {p.decode_tok_s / 1e3:.1f}k tok/s; groups with signal {p.signal:.0%}, "
            f"{p.generated_chains:,.0f} chains and {p.generated_tokens / 1e6:.1f}M tokens generated, {p.trained_tokens / 1e6:.1f}M trained per step: {p.step_s / 60:.1f} min "
            f"({', '.join(f'{k} {v / 60:.1f}' for k, v in p.step_parts.items())}; {p.waves} waves, "
            f"{p.preempted:.0%} preempted) x {p.steps} + {p.start_s / 60:.1f} min start per attempt = "
            f"{p.gpu_hours:.0f} GPU-h | checkpoint {p.checkpoint_bytes / 1e6:.0f} MB every {p.save_every} | "
            f"limit {p.runtime_min} min x {p.attempts}, USR1@{p.signal_s}s")


def eval_line(p: EvalPlan) -> str:
    return (f"evaluate {p.run} {p.benchmark}: {p.gpus} GPU | peak {g(p.memory.peak)}/{g(p.gpu_mem)} GiB = "
            f"{_terms(p.memory.terms)}, {p.concurrency:.0f} seqs of {p.max_model_len}, {p.preempted:.0%} preempted | "
            f"{p.decode_tok_s / 1e3:.1f}k "
            f"tok/s: {p.seconds / 60:.1f} min, {p.gpu_hours:.2f} GPU-h | limit {p.runtime_min} min")


# ---- the table -------------------------------------------------------------------------------------

COLUMNS = ("job", "GPUs", "peak GiB/GPU (phase)", "time", "limit", "GPU-h", "host GiB", "partition")
RIGHT = {"GPUs", "time", "GPU-h", "host GiB"}  # columns of numbers, aligned right


def duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 90 * 60 else f"{seconds / 3600:.1f} h"


def partition(m: Matrix, run: str) -> str:
    s = slurm.settings(m.config, bool(jobs.gpus(m, run, "train")), m.size_of(run))
    return s.get("partition") or slurm.UNSET


def train_row(m: Matrix, p: TrainPlan) -> tuple:
    gpus = p.gpus * p.nodes
    return (f"train {p.run}", gpus, f"{g(p.memory.peak)}/{g(p.gpu_mem)} ({p.memory.phase})",
            duration(p.gpu_hours / gpus * 3600), f"{duration(p.runtime_min * 60)} x {p.attempts}", p.gpu_hours,
            jobs.host_memory_mb(m, p.run, "train") / 1024, partition(m, p.run))


def eval_row(m: Matrix, p: EvalPlan) -> tuple:
    return (f"evaluate {p.run} {p.benchmark}", p.gpus, f"{g(p.memory.peak)}/{g(p.gpu_mem)} ({p.memory.phase})",
            duration(p.seconds), duration(p.runtime_min * 60), p.gpu_hours,
            jobs.host_memory_mb(m, p.run, "eval") / 1024, partition(m, p.run))


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.1f}" if value >= 1 else f"{value:.2f}"
    return str(value)


def table_lines(m: Matrix, plans) -> list[str]:
    """One row per planned job under the paper table that first shows it, a subtotal per table."""
    owner = {}
    for table in m.config["tables"]:
        for pair in m.table_evaluations(table):
            owner.setdefault(pair, table)
    groups = {table: ([], 0.0) for table in m.config["tables"]}
    for run, p in plans.train.items():
        rows, hours = groups[m.runs[run]["table"]]
        groups[m.runs[run]["table"]] = (rows + [train_row(m, p)], hours + p.gpu_hours)
    for pair, p in plans.eval.items():
        rows, hours = groups[owner[pair]]
        groups[owner[pair]] = (rows + [eval_row(m, p)], hours + p.gpu_hours)
    cells = [COLUMNS] + [tuple(map(_cell, row)) for rows, _ in groups.values() for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]

    def line(row) -> str:
        return "  ".join(c.rjust(w) if name in RIGHT else c.ljust(w)
                         for c, w, name in zip(row, widths, COLUMNS)).rstrip()

    out = [line(COLUMNS)]
    for table, (rows, hours) in groups.items():
        title = m.config["tables"][table].get("title", table)
        if not rows:
            out += ["", f"{table} ({title}): every job is counted with an earlier table"]
            continue
        n_train = sum(row[0].startswith("train ") for row in rows)
        out += ["", f"{table} ({title})"] + [line(tuple(map(_cell, row))) for row in rows]
        out.append(f"  subtotal {table}: {hours:,.0f} GPU-h ({n_train} training runs, {len(rows) - n_train} "
                   "evaluations)")
    return out


def summary_lines(m: Matrix, plans) -> list[str]:
    train = sum(p.gpu_hours for p in plans.train.values())
    evaluation = sum(p.gpu_hours for p in plans.eval.values())
    lines = [f"Total: {train + evaluation:,.0f} GPU-hours ({train:,.0f} training {len(plans.train)} runs, "
             f"{evaluation:,.0f} evaluating {len(plans.eval)} jobs)"]
    for run, p in plans.train.items():
        spec = m.runs[run]
        paper = PAPER_GPU_HOURS.get(spec["train_set"])
        if m.config["methods"][spec["method"]].get("paper") == "bfspo" and paper:
            lines.append(f"  {run}: {p.gpu_hours:.0f} GPU-h for {p.steps} steps; the paper: {paper} GPU-h per BFS-PO "
                         f"run on {spec['train_set']} (8 A100s x {paper // 8} h)")
    return lines


def micro_batch_lines(m: Matrix, plans, gpu_mem_gb: float | None) -> list[str]:
    """Per size class (its first planned run): the largest micro_batch_tokens that keep the peak within
    90% of the card, vLLM resident during the update and asleep (what the class's setting is chosen from)."""
    lines, seen = [], set()
    for run, p in plans.train.items():
        size = m.size_of(run)
        if size in seen:
            continue
        seen.add(size)
        fits = [largest_micro_batch(m, run, resident, gpu_mem_gb=gpu_mem_gb) for resident in (True, False)]
        lines.append(f"  class {size}: micro_batch_tokens {p.micro_batch_tokens}; the largest power of two within 90% "
                     f"of {g(p.gpu_mem)} GiB: {fits[0]} with vLLM resident, {fits[1]} asleep")
    return lines


def schedule_lines(plans, slots: int | None) -> list[str]:
    """The critical path of the planned jobs (hours, along the DAG's dependencies) and the GPUs they
    hold at once when the Slurm profile runs `slots` jobs at a time (bfspo/pipeline/schedule.py)."""
    planned = schedule.plan_jobs(plans)
    hours, chain = schedule.critical_path(planned)
    t = schedule.simulate(planned, slots)
    at_once = f"{slots} jobs at once (slurm/config.yaml: jobs)" if slots else "every job at once (no profile)"
    return [f"Critical path: {hours:,.1f} h, without the queue's wait, the data preparation and the tables:",
            "  " + " -> ".join(f"{j.name} {j.hours:,.1f} h" for j in chain),
            f"Peak GPUs at {at_once}: {t.peak_gpus}, from {t.peak_at:,.1f} h ({len(t.peak_jobs)} jobs, "
            f"{sum(j.startswith('train ') for j in t.peak_jobs)} of them training); the last job ends at "
            f"{t.makespan:,.1f} h"]


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", nargs="+", action="extend", metavar="FILE",
                   help="workflow config file(s), merged as `snakemake --configfile A B` merges them: a later "
                        "file's keys replace an earlier one's, mapping by mapping (default: config/config.yaml)")
    p.add_argument("--gpu-mem-gb", type=float, help="plan every job for a GPU of this many GiB instead of its "
                                                    "class's gpu_mem_gb (e.g. 40)")
    p.add_argument("--verbose", action="store_true", help="also the throughput assumptions and every job's "
                                                          "memory and time, term by term")


def run(args) -> int:
    files = args.config or ["config/config.yaml"]
    p = plan(read_configs(files), files, gpu_mem_gb=args.gpu_mem_gb)
    m, plans = p.matrix, p.jobs
    if plans is None:  # stopped before the GPU plan: the config itself, or what every job would refuse
        raise BfspoError(p.refusal)
    if args.verbose:
        print(assumptions_text())
        print()
        for tp in plans.train.values():
            print(train_line(tp))
        for ep in plans.eval.values():
            print(eval_line(ep))
        print()
    if plans.train or plans.eval:
        print("\n".join(table_lines(m, plans)))
    unplanned = [r for r in m.runs if r not in plans.train]
    if unplanned:
        print(f"not planned (CPU classes, or models this workflow builds): {len(unplanned)} training run(s), "
              f"{len(m.evaluations()) - len(plans.eval)} evaluation(s)")
    print()
    print("\n".join(summary_lines(m, plans)))
    if plans.train:
        print("\n".join(micro_batch_lines(m, plans, args.gpu_mem_gb)))
    if plans.train or plans.eval:
        print("\n".join(schedule_lines(plans, jobs.profile_jobs())))
    for warning in p.warnings:
        print("\n" + warning)
    if not args.verbose:
        print("(the assumptions, and every job's memory and time term by term: bfspo plan --verbose)")
    if p.problems:
        print("\nRefused, as `snakemake -n` refuses it:\n" + p.refusal)
    else:
        print("\nEvery planned job fits its GPU." if plans.train or plans.eval else
              "\nNo job is planned: no GPU class runs a model whose shapes are known before the run.")
    if p.unset:
        print(p.unset)
    return 1 if p.problems else 0
