"""How long the jobs take: the throughput assumptions, in one place, and the time terms built on them.

Every figure here is an assumption until bench/gpu_session.sh measures it on a lent GPU (it prints
the measured rates beside these). The sources:

- Hardware: NVIDIA A100 80GB SXM datasheet (the paper's GPU, App. C "8 A100"): 312 TFLOP/s dense
  bfloat16, 2.039 TB/s HBM2e. An H100 (989 TFLOP/s, 3.35 TB/s) is faster, so time limits planned
  for an A100 hold there.
- Training: 6 N FLOPs per trained token (Kaplan et al. 2020, "Scaling Laws for Neural Language
  Models", Sec. 2.1: 2N forward, 4N backward). With LoRA the backward skips the base weights'
  gradients (2N) and gradient checkpointing recomputes the forward (2N), so 6N holds with
  checkpointing and 4N without. The forward that gives the old log-probs (and, for K > 0, the
  entropies of every generated token, needed for backtracking) adds 2N per token it covers.
  Model FLOPs utilisation (MFU, Chowdhery et al. 2022, PaLM, App. B) of 30%: below the 46-52% of
  large dense pre-training (PaLM; Narayanan et al. 2021, Megatron-LM), for LoRA's smaller GEMMs,
  packed tree attention and micro-batches of a few ten thousand tokens.
- Generation (vLLM, continuous batching): a roofline of one decode step of S running sequences:
  it reads the weights and the KV cache of every sequence once, and computes 2N FLOPs per
  sequence; time = max(bytes / (60% of HBM bandwidth), FLOPs / (40% of peak)). Prefill of the
  prompts (once per prompt: vLLM's prefix cache serves the other samples) at the training MFU.
- Lengths: mean answer length as a fraction of the budget, per benchmark, from the paper's
  zero-shot lengths (data/reported_results.csv: Qwen2.5-3B on GSM8K 315 of 512 tokens, the 7-8B
  models on MATH-500 503-573 of 1024, MMLU-STEM 356-400 of 512, AIME'25 852-873 of 1024,
  Minerva 553-623 of 1024). Prompt tokens: the characters of data/raw's questions / 3 (a
  pessimistic characters-per-token for mixed prose and LaTeX), plus 60 tokens of chat template and
  instruction; the mean, and the longest (which, with the budget, sets vLLM's max_model_len).
- Dynamic sampling: half of the generated groups carry signal (mixed right and wrong answers);
  BFS-PO's expansions regenerate half a chain each (they branch at the highest-entropy token of
  the best path, on average half-way).
- Fixed costs: 3 minutes to start a job (load the model, start vLLM, capture CUDA graphs);
  30 s per training step (adapter hand-over to vLLM, sleep and wake-up, logging).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bfspo.pipeline.memory import kv_cache_per_token, matmul_params
from bfspo.pipeline.shapes import Shape


@dataclass(frozen=True)
class Hardware:
    name: str
    flops: float  # dense bfloat16 FLOP/s
    bandwidth: float  # HBM bytes/s


A100 = Hardware("A100-SXM4-80GB", 312e12, 2.039e12)


@dataclass(frozen=True)
class Assumptions:
    """Every throughput and workload assumption of the plan (see the module doc for the sources)."""

    hardware: Hardware = A100
    train_mfu: float = 0.30
    decode_mfu: float = 0.40
    decode_bandwidth: float = 0.60  # fraction of HBM bandwidth a decode step achieves
    keep_fraction: float = 0.5  # groups with signal, of those generated
    expansion_share: float = 0.5  # tokens an expansion generates, as a share of a whole chain
    job_start_s: float = 180.0
    step_overhead_s: float = 30.0
    # mean answer length / budget, per benchmark (the train sets: as their benchmark)
    answer_fraction: tuple = (("gsm8k", 0.62), ("gsm8k_train", 0.62), ("math500", 0.56), ("math_train", 0.56),
                              ("mmlu_stem", 0.78), ("aime25", 0.85), ("minerva_math", 0.61))
    # (mean, longest) prompt tokens, per benchmark: data/raw's question characters / 3 + 60
    prompt_tokens: tuple = (("gsm8k", (140, 345)), ("gsm8k_train", (140, 390)), ("math500", (125, 640)),
                            ("math_train", (125, 1005)), ("mmlu_stem", (145, 575)), ("aime25", (200, 670)),
                            ("minerva_math", (200, 395)))
    # questions per evaluation benchmark (rows of data/raw)
    questions: tuple = (("gsm8k", 1319), ("math500", 500), ("mmlu_stem", 3018), ("aime25", 30),
                        ("minerva_math", 272))
    default_answer_fraction: float = 0.7
    default_prompt_tokens: tuple = (200, 500)
    default_questions: int = 1000

    def answer_tokens(self, benchmark: str, budget: int) -> float:
        return dict(self.answer_fraction).get(benchmark, self.default_answer_fraction) * budget

    def prompt(self, benchmark: str) -> tuple[int, int]:
        """(mean, longest) prompt tokens of a benchmark."""
        return dict(self.prompt_tokens).get(benchmark, self.default_prompt_tokens)

    def n_questions(self, benchmark: str) -> int:
        return dict(self.questions).get(benchmark, self.default_questions)


ASSUMPTIONS = Assumptions()


def decode_tokens_per_s(s: Shape, sequences: float, context: float, a: Assumptions = ASSUMPTIONS,
                        b: int = 2) -> float:
    """Generated tokens per second of one GPU decoding `sequences` sequences at once, each with
    `context` tokens of KV cache on average (the roofline of one decode step):

        t_step = max((N b + S c kv_token) / (eta_bw BW), 2 N S / (eta_c F)),  tokens/s = S / t_step
    """
    n = matmul_params(s)
    memory_s = (n * b + sequences * context * kv_cache_per_token(s, b)) / (a.decode_bandwidth * a.hardware.bandwidth)
    compute_s = 2 * n * sequences / (a.decode_mfu * a.hardware.flops)
    return sequences / max(memory_s, compute_s)


def forward_s(s: Shape, tokens: float, flops_per_param: int, a: Assumptions = ASSUMPTIONS) -> float:
    """Seconds of `flops_per_param` x N FLOPs per token over `tokens` tokens at the training MFU
    (2 for a forward pass, 6 for LoRA's update with gradient checkpointing, 4 without)."""
    return flops_per_param * matmul_params(s) * tokens / (a.train_mfu * a.hardware.flops)


def generation_rounds_factor(keep: float, oversample: float, max_rounds: int) -> float:
    """Questions generated per question needed (bfspo/training/batching.py `fill`): each round asks
    for `oversample` times the missing ones, of which a share `keep` carries signal:
    oversample x sum_{i < R} (1 - keep x oversample)^i, R the rounds until full (at most max_rounds).
    One round when keep x oversample >= 1."""
    missing = 1.0
    total = 0.0
    for _ in range(max_rounds):
        if missing <= 0:
            break
        total += oversample * missing
        missing -= keep * oversample * missing
    return total


def chain_tokens_factor(k: int, a: Assumptions = ASSUMPTIONS) -> float:
    """Generated tokens per chain, as a share of a whole chain: 1 for DAPO; a BFS-PO tree of
    G (K + 1) chains generates G whole chains and K G partial ones: (1 + K beta) / (1 + K)."""
    return (1 + k * a.expansion_share) / (1 + k)


def ceil_div(a: float, b: float) -> int:
    return int(math.ceil(a / b - 1e-9))
