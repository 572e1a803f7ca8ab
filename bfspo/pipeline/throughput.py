"""How long the jobs take: the throughput assumptions, in one place, and the time terms built on them.

Every figure here is an assumption until bench/gpu/gpu_session.sh measures it on a lent GPU (it prints
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
- Dynamic sampling: a group carries signal when its answers are mixed, right and wrong
  (`signal_rate`): with independent samples of accuracy p, a group of n answers does with
  probability 1 - p^n - (1 - p)^n, n = G for DAPO and for BFS-PO's `first_samples` filter, and n =
  G (K + 1) leaves for `all_leaves` (expansions continue prefixes of the first answers, so their
  outcomes correlate: an upper bound, measured on the toy by bench/bench_filter_cost.py). p per
  train set: the zero-shot accuracy that the paper reports for the models it trains on that set
  (data/reported_results.csv, greedy: GSM8K 83.7 / 86.2 / 91.4 for Qwen2.5-3B, Llama-3.1-8B,
  Qwen2.5-7B, mean 87.1%; MATH-500 48.6 / 72.8 for Llama-3.1-8B, Qwen2.5-7B, mean 60.7%, for the
  MATH train set). Under `first_samples` a tree whose first answers lack signal is not expanded:
  its expansions are generated only for the trees that pass. BFS-PO's expansions regenerate half
  a chain each (they branch at the highest-entropy token of the best path, on average half-way).
- Fixed costs: 3 minutes to start a job (load the model, build the trainer); 30 s per training
  step (adapter hand-over to vLLM, sleep and wake-up, logging).

What a GPU run would check first (issue 30: the terms below were left out before, each an
estimate until bench/gpu/gpu_check.py or a real run measures it):

- LoRA's decode cost: vLLM serves the policy as base weights plus a LoRA adapter, whose kernels
  cost 20-50% of the decode rate at high batch (issue 30's estimate, from vLLM's LoRA benchmarks;
  bench/bench_plan_decode.py measures without LoRA); planned at 35%, for every decode of a
  trained adapter (training rollouts; evaluation of a trained run, not a zero-shot one).
- The tail of each wave: every engine call (one per BFS-PO wave: K + 1 waves per generation
  round, each waiting for the previous one; one per evaluation batch) ends with its longest
  chain, which runs up to the budget while the mean answer is about 0.6 of it; the call lasts
  (budget - mean answer) decode steps longer than its tokens need at full concurrency, at half
  the concurrency (`wave_tail_s`). A streamed rollout (vLLM's default, bfspo.rollout.streamed) is
  one engine loop per step that trees and questions join as others finish: one tail, when it drains.
- KV preemption: vLLM admits up to max_num_seqs sequences while their KV cache is short; when
  max_num_seqs x (prompt + answer) exceeds the cache, the excess share of the sequences is
  preempted and recomputed (vLLM's recompute preemption): each planned once, half-way, its
  context prefilled again at the training MFU (`preempted_share`, `recompute_tokens`).
- Start-up beyond the 3 minutes: vLLM's engine start (memory profiling, torch.compile, CUDA graph
  capture), 90 s, in every job that runs vLLM; flex attention's compiles in every training job, on
  every attempt (below).

Issue 38's terms (each an estimate until the GPU check or a run measures it):

- The rescoring's rows (vLLM's samples, rescored on the training side: bfspo.rollout.rescore). Each
  group (a context and its G samples) is a tree of its own, its context computed once: a line-2
  group holds the prompt, an expansion's the prompt and the prefix it continues (1 - beta of a
  chain), then the G samples. Groups share rows (at most micro_batch_tokens tokens) and the flex
  kernel pads each row to its bucket length: half a bucket per row on average (`rescored_row_tokens`).
  A lockstep call packs its wave's groups; a streamed rollout packs the groups that wait together
  (bfspo.rollout.streamed: up to PENDING_SHARE of the engine's sequences), and as the engine
  drains (under half its capacity) about one group per row. Waiting groups hold back half of
  PENDING_SHARE of the engine's sequences on average: the streamed decode runs at that much lower
  concurrency.
- Flex attention's compiles: one graph per bucket length and autograd mode, so a training attempt
  compiles 2 graphs (forward, backward) per bucket length its update's rows meet and 1 (forward)
  per bucket length its rescoring's rows meet, `compile_graph_s` each (30 s: issue 38 estimated
  30-90 s for a forward and backward pair on an H100; part 1 of the GPU check times both).
  Which lengths rows meet (`row_length_ranges`, `buckets_met`): rows filled to within one packed
  unit (a tree, a group) of micro_batch_tokens, and the last row of each packing call, whose length
  is what the call's total leaves over, spread over +-3 standard deviations of that total across
  the attempt's hundreds of calls. An answer's length has a standard deviation of `answer_cv` of
  its mean (0.3: answers from about half to one and a half times the mean, as the benchmarks' trees
  of bench/bench_plan_memory.py), independently, so a total of n answers spreads by
  answer_cv x mean answer x sqrt(n).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bfspo.algorithm.advantages import FILTERS
from bfspo.algorithm.attention_options import bucket_lengths
from bfspo.errors import BfspoError
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
    # per-sample accuracy p of the policy on each train set (`signal_rate`; the module doc's source)
    sample_accuracy: tuple = (("gsm8k_train", 0.871), ("math_train", 0.607))
    default_sample_accuracy: float = 0.5
    # `sampling: keep_rate`: the run's keep-rate estimate over the true keep rate (`signal_rate`); 1: the
    # estimate is right, so a round asks 1 / keep times the need (within 1x and oversample) and fills the batch
    keep_rate_estimate: float = 1.0
    expansion_share: float = 0.5  # tokens an expansion generates, as a share of a whole chain
    job_start_s: float = 180.0
    engine_start_s: float = 90.0  # vLLM: profiling, torch.compile, CUDA graph capture (every vLLM job)
    compile_graph_s: float = 30.0  # one compiled flex graph: a bucket length's forward, or its backward
    answer_cv: float = 0.3  # an answer's length: standard deviation / mean (which bucket lengths rows meet)
    step_overhead_s: float = 30.0
    lora_decode_overhead: float = 0.35  # decode time added by vLLM's LoRA kernels (20-50% at high batch)
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

    def accuracy(self, benchmark: str) -> float:
        return dict(self.sample_accuracy).get(benchmark, self.default_sample_accuracy)

    def n_questions(self, benchmark: str) -> int:
        return dict(self.questions).get(benchmark, self.default_questions)


ASSUMPTIONS = Assumptions()


def decode_step_s(s: Shape, sequences: float, context: float, a: Assumptions = ASSUMPTIONS, b: int = 2,
                  lora: bool = False) -> float:
    """Seconds of one decode step of `sequences` sequences, each with `context` tokens of KV cache on
    average (the roofline), times (1 + LoRA's overhead) when a LoRA adapter is served:

        t_step = max((N b + S c kv_token) / (eta_bw BW), 2 N S / (eta_c F)) (1 + lora_overhead)
    """
    n = matmul_params(s)
    memory_s = (n * b + sequences * context * kv_cache_per_token(s, b)) / (a.decode_bandwidth * a.hardware.bandwidth)
    compute_s = 2 * n * sequences / (a.decode_mfu * a.hardware.flops)
    return max(memory_s, compute_s) * (1 + a.lora_decode_overhead if lora else 1)


def decode_tokens_per_s(s: Shape, sequences: float, context: float, a: Assumptions = ASSUMPTIONS,
                        b: int = 2, lora: bool = False) -> float:
    """Generated tokens per second of one GPU decoding `sequences` sequences at once: S / t_step."""
    return sequences / decode_step_s(s, sequences, context, a, b, lora)


def wave_tail_s(s: Shape, budget: int, answer: float, concurrency: float, context: float,
                a: Assumptions = ASSUMPTIONS, b: int = 2, lora: bool = False) -> float:
    """The tail of one engine call (a wave): its longest chain runs to the budget, (budget - mean
    answer) decode steps after the tokens at full concurrency would be done, at half the concurrency:
    (B - a) t_step(max(S / 2, 1))."""
    return max(budget - answer, 0.0) * decode_step_s(s, max(concurrency / 2, 1.0), context, a, b, lora)


def preempted_share(max_num_seqs: int, kv_tokens: float, sequence_tokens: float) -> float:
    """The share of sequences vLLM preempts when max_num_seqs sequences of `sequence_tokens` tokens
    (prompt + answer) need more KV cache than its `kv_tokens`: max(0, 1 - C / (S L))."""
    return max(0.0, 1.0 - kv_tokens / (max_num_seqs * sequence_tokens))


def recompute_tokens(sequences: float, share: float, prompt: float, answer: float) -> float:
    """Tokens prefilled again after preemption: each preempted sequence once, half-way through its
    answer: sequences x share x (prompt + answer / 2)."""
    return sequences * share * (prompt + answer / 2)


def start_s(a: Assumptions = ASSUMPTIONS, vllm: bool = False, graphs: int = 0) -> float:
    """Seconds to start one job attempt: the model and trainer, vLLM's engine, and `graphs` compiled
    flex attention graphs (`compiled_graphs`)."""
    return a.job_start_s + (a.engine_start_s if vllm else 0.0) + graphs * a.compile_graph_s


def row_length_ranges(units: float, unit_tokens: float, spread: float, max_tokens: int) -> list[tuple[float, float]]:
    """The (low, high) row lengths that packing calls of `units` units (trees or groups) of
    `unit_tokens` row tokens each, their total spread by `spread` tokens (one standard deviation),
    give over many calls, first fit into rows of at most `max_tokens`: one row of the total +-3
    spreads if that fits, else rows filled to within one unit of max_tokens and a last row of
    what the total leaves over (every length, if the total's range spans max_tokens)."""
    total = units * unit_tokens
    lo, hi = max(1.0, total - 3 * spread), total + 3 * spread
    if hi <= max_tokens:
        return [(lo, hi)]
    full = (max(1.0, max_tokens - unit_tokens), float(max_tokens))
    if hi - lo >= max_tokens:
        return [full, (1.0, float(max_tokens))]
    first, last = lo % max_tokens or max_tokens, hi % max_tokens or max_tokens
    if first <= last:
        return [full, (first, last)]
    return [full, (1.0, last), (first, float(max_tokens))]


def buckets_met(ranges: list[tuple[float, float]], max_tokens: int, step: int) -> int:
    """How many of the bucket lengths (bfspo.algorithm.attention_options.bucket_lengths) rows of
    these lengths are padded to: a bucket L meets a range when some length in (previous bucket, L]
    lies in it."""
    lengths = bucket_lengths(max_tokens, step)
    met = {length for i, length in enumerate(lengths) for lo, hi in ranges
           if lo <= length and hi > (lengths[i - 1] if i else 0)}
    return len(met)


def compiled_graphs(update_buckets: int, rescore_buckets: int) -> int:
    """Flex graphs one training attempt compiles: a forward and a backward per bucket length of the
    update, a forward (no gradients) per bucket length of the rescoring."""
    return 2 * update_buckets + rescore_buckets


def rescored_row_tokens(tokens: float, rows: float, bucket: int, padded: bool) -> float:
    """Tokens the rescoring's forwards run: its rows' `tokens`, plus half a bucket of padding per row
    where the flex kernel pads them (at most one bucket per row)."""
    return tokens + (rows * bucket / 2 if padded else 0.0)


def forward_s(s: Shape, tokens: float, flops_per_param: int, a: Assumptions = ASSUMPTIONS) -> float:
    """Seconds of `flops_per_param` x N FLOPs per token over `tokens` tokens at the training MFU
    (2 for a forward pass, 6 for LoRA's update with gradient checkpointing, 4 without)."""
    return flops_per_param * matmul_params(s) * tokens / (a.train_mfu * a.hardware.flops)


def signal_rate(group_size: int, k: int, filter: str, accuracy: float) -> float:
    """The share of generated groups that pass the dynamic-sampling filter (Eq. 2, 0 < #correct < n)
    when each answer is right with probability p = `accuracy`, independently:

        P(signal) = 1 - p^n - (1 - p)^n,   n = G for K = 0 or filter "first_samples", G (K + 1) for "all_leaves"
    """
    if filter not in FILTERS:
        raise BfspoError(f"unknown filter {filter!r}; expected one of {FILTERS}")
    if not 0.0 <= accuracy <= 1.0:
        raise BfspoError(f"a per-sample accuracy is a probability, got {accuracy}")
    n = group_size * (k + 1) if filter == "all_leaves" else group_size
    return 1.0 - accuracy ** n - (1.0 - accuracy) ** n


def expanded_share(k: int, filter: str, keep: float) -> float:
    """The share of generated trees that BFS-PO expands: all of them under "all_leaves", those whose
    first answers pass under "first_samples" (the others stop before the search); none for K = 0."""
    if k == 0:
        return 0.0
    return keep if filter == "first_samples" else 1.0


def generation_rounds(keep: float, oversample: float, max_rounds: int) -> list[float]:
    """Questions generated in each round, per question needed (bfspo/training/batching.py `fill`):
    each round asks for `oversample` times the missing ones, of which a share `keep` carries signal:
    round i generates oversample x (1 - keep x oversample)^i, until full (at most max_rounds).
    One round when keep x oversample >= 1. `oversample` is the rate a round asks at
    (bfspo.training.batching.ask_rate: the config's oversample, or 1 / the keep rate)."""
    missing = 1.0
    rounds = []
    for _ in range(max_rounds):
        if missing <= 1e-9:  # full: keep x oversample = 1 leaves rounding, not a round's worth
            break
        rounds.append(oversample * missing)
        missing -= keep * oversample * missing
    return rounds


def generation_rounds_factor(keep: float, oversample: float, max_rounds: int) -> float:
    """Questions generated per question needed: the sum over the rounds of `generation_rounds`."""
    return sum(generation_rounds(keep, oversample, max_rounds))


def chain_tokens_factor(k: int, a: Assumptions = ASSUMPTIONS) -> float:
    """Generated tokens per chain, as a share of a whole chain: 1 for DAPO; a BFS-PO tree of
    G (K + 1) chains generates G whole chains and K G partial ones: (1 + K beta) / (1 + K)."""
    return (1 + k * a.expansion_share) / (1 + k)


def generated_chain_tokens(group_size: int, k: int, expanded: float, a: Assumptions = ASSUMPTIONS) -> float:
    """Generated tokens per generated tree, in whole chains: its G first answers, and K G expansions
    of beta of a chain each for the `expanded` share of trees that are searched: G (1 + e K beta)."""
    return group_size * (1 + expanded * k * a.expansion_share)


def ceil_div(a: float, b: float) -> int:
    return int(math.ceil(a / b - 1e-9))
