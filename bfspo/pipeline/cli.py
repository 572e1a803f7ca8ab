"""`bfspo plan`: the GPU plan of every train and evaluate job of a workflow config, one line each.

    bfspo plan --config config/paper.yaml                 # as the config's size classes say
    bfspo plan --config config/paper.yaml --gpu-mem-gb 40  # every job against a 40 GB card

Each line: the job's peak memory per GPU, term by term, in the phase that peaks (the update with
vLLM asleep, or the rescoring forward with vLLM awake; the update with vLLM resident alongside),
the activations with and without gradient checkpointing, vLLM's share (weights and KV cache), the
time per step and GPU-hours from the stated throughput assumptions (printed first), the checkpoint
size and interval, and the time limit and warning signal the rules will ask Slurm for. Then the
totals, against the paper's 96 (GSM8K) and 192 (MATH) GPU-hours per BFS-PO run. A job that cannot
fit is named with its largest term, and the command exits with status 1, as Snakemake refuses it.
"""

from __future__ import annotations

import argparse

from bfspo.pipeline.gpu_plan import (CHECKPOINT_BYTES_S, CUDA_CONTEXT, HEAD_CHUNK_ROWS, SAFETY, VLLM_ASLEEP, EvalPlan,
                                     TrainPlan, largest_micro_batch, plan_matrix)
from bfspo.pipeline.matrix import Matrix, load_config
from bfspo.pipeline.memory import GIB
from bfspo.pipeline.throughput import ASSUMPTIONS

# The paper's compute per BFS-PO run (App. C: 8 A100s for 12 h on GSM8K, 24 h on MATH), by train set.
PAPER_GPU_HOURS = {"gsm8k": 96, "math": 192}


def g(x: float) -> str:
    return f"{x / GIB:.1f}"


def assumptions_text() -> str:
    a = ASSUMPTIONS
    hw = a.hardware
    return "\n".join([
        "Assumptions (bfspo/pipeline/throughput.py, gpu_plan.py; bench/gpu_session.sh measures them):",
        f"  GPU {hw.name}: {hw.flops / 1e12:.0f} TFLOP/s bf16, {hw.bandwidth / 1e12:.2f} TB/s; weights and "
        f"activations in bfloat16, LoRA and AdamW in float32",
        f"  training: 2N FLOPs/token for the rescoring forward (old log-probs, entropies) of every generated "
        f"tree, 6N (4N without checkpointing) for the update of the kept ones, at {a.train_mfu:.0%} MFU",
        f"  decoding (vLLM): roofline of a decode step at {a.decode_bandwidth:.0%} of HBM bandwidth and "
        f"{a.decode_mfu:.0%} MFU, concurrency min(max_num_seqs, what the KV cache holds)",
        f"  groups with signal 1 - p^n - (1 - p)^n (n = G, or G (K + 1) leaves under filter all_leaves), per-sample "
        f"accuracy p {', '.join(f'{k} {v:.3f}' for k, v in a.sample_accuracy)}; under first_samples only the trees "
        f"that pass are expanded; an expansion regenerates {a.expansion_share:.0%} of a chain; "
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


def summary_lines(m: Matrix, plans) -> list[str]:
    train = sum(p.gpu_hours for p in plans.train.values())
    evaluation = sum(p.gpu_hours for p in plans.eval.values())
    lines = [f"Total: {train + evaluation:.0f} GPU-hours ({train:.0f} training {len(plans.train)} runs, "
             f"{evaluation:.0f} evaluating {len(plans.eval)} jobs)"]
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
        size = m.config["models"][m.model_of(run)]["size"]
        if size in seen:
            continue
        seen.add(size)
        fits = [largest_micro_batch(m, run, resident, gpu_mem_gb=gpu_mem_gb) for resident in (True, False)]
        lines.append(f"  class {size}: micro_batch_tokens {p.micro_batch_tokens}; the largest power of two within 90% "
                     f"of {g(p.gpu_mem)} GiB: {fits[0]} with vLLM resident, {fits[1]} asleep")
    return lines


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="config/config.yaml", help="workflow config (default: config/config.yaml)")
    p.add_argument("--gpu-mem-gb", type=float, help="plan every job for a GPU of this many GiB instead of its "
                                                    "class's gpu_mem_gb (e.g. 40)")


def run(args) -> int:
    m = Matrix(load_config(args.config))
    plans = plan_matrix(m, gpu_mem_gb=args.gpu_mem_gb)
    print(assumptions_text())
    print()
    unplanned = [r for r in m.runs if r not in plans.train]
    for p in plans.train.values():
        print(train_line(p))
    for p in plans.eval.values():
        print(eval_line(p))
    if unplanned:
        print(f"not planned (CPU classes, or models this workflow builds): {len(unplanned)} training run(s), "
              f"{len(m.evaluations()) - len(plans.eval)} evaluation(s)")
    print()
    print("\n".join(summary_lines(m, plans)))
    if plans.train:
        print("\n".join(micro_batch_lines(m, plans, args.gpu_mem_gb)))
    errors = plans.errors()
    if errors:
        print("\nJobs that cannot run:\n  " + "\n  ".join(errors))
        return 1
    print("\nEvery planned job fits its GPU." if plans.train or plans.eval else
          "\nNo job is planned: no GPU class runs a model whose shapes are known before the run.")
    return 0

