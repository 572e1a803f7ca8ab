"""The GPU plan of every train and evaluate job: peak memory per GPU, term by term, time and
GPU-hours, checkpoint size and interval, time limit and Slurm's warning signal; and the refusal,
before anything is submitted, of a job that cannot fit its GPU.

A job is planned when it runs on GPUs (its size class has `gpus` > 0) and its model's shapes are
known before the run (bfspo/pipeline/shapes.py: a hub model's shipped config.json, or a local
model directory; not a model that this workflow builds, such as the toy or a stand-in). The
memory terms are bfspo/pipeline/memory.py's, the time terms bfspo/pipeline/throughput.py's, with
the constants below.

What follows from a plan (bfspo/pipeline/jobs.py):

- the job's time limit (Slurm `runtime`): the planned time x SAFETY, at most the class's
  `train_runtime` / `eval_runtime` (the partition's limit); a run that needs more is continued by
  the profile's retries, each from its last checkpoint;
- the warning signal of a training job, `--signal=USR1@<s>` with s = SAFETY x (one step +
  one checkpoint): the trainer finishes the step, checkpoints it and exits (143);
- the checkpoint interval `save_every` (unless the config sets it): the fewest steps whose
  checkpoint costs at most CHECKPOINT_SHARE of their time, so a killed job loses about one step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from bfspo.pipeline import jobs, memory
from bfspo.pipeline.matrix import Matrix
from bfspo.pipeline.memory import GIB
from bfspo.pipeline.shapes import Shape, load_shape
from bfspo.pipeline.throughput import (
    ASSUMPTIONS,
    Assumptions,
    buckets_met,
    chain_tokens_factor,
    compiled_graphs,
    decode_tokens_per_s,
    expanded_share,
    forward_s,
    generated_chain_tokens,
    generation_rounds,
    preempted_share,
    recompute_tokens,
    rescored_row_tokens,
    row_length_ranges,
    signal_rate,
    start_s,
    wave_tail_s,
)
from bfspo.rollout.streamed import PENDING_SHARE, resolve_rollout
from bfspo.training.batching import KeepRate, ask_rate

SAFETY = 1.5  # time limits and the warning ask for the planned time x 1.5
CHECKPOINT_BYTES_S = 200e6  # writing (and hashing) a checkpoint on a shared file system
CHECKPOINT_SHARE = 0.02  # at most this share of the training time goes to checkpoints
CUDA_CONTEXT = GIB // 2  # per process on a GPU: the CUDA context and cuBLAS/NCCL workspaces
VLLM_ASLEEP = GIB  # what a sleeping vLLM engine keeps on the GPU (CUDA graphs, its context)
VLLM_BATCHED_TOKENS = 8192  # vLLM's max_num_batched_tokens (chunked prefill), for its workspace
HEAD_CHUNK_ROWS = 1024  # bfspo.algorithm.packing.packed_logprobs' chunk_size (tests keep them equal)
GPU_DTYPE_BYTES = 2  # bfloat16 on CUDA (bfspo.model_io.default_dtype)
EVAL_DEFAULTS = {"gpu_memory_utilization": 0.9, "max_num_seqs": 1024}  # bfspo evaluate's (a test keeps them equal)
SIGNAL_MAX_S = 65535  # the most seconds sbatch --signal accepts
MIN_RUNTIME_MIN = 20  # no planned time limit below this: room for a slow file system or a busy node


@dataclass
class Memory:
    """Peak GPU memory of one GPU of a job, by term (bytes)."""

    terms: dict = field(default_factory=dict)  # name -> bytes of the phase that peaks
    peak: int = 0
    phase: str = ""

    @property
    def largest(self) -> tuple[str, int]:
        return max(self.terms.items(), key=lambda kv: kv[1])


@dataclass
class TrainPlan:
    run: str
    shape: Shape
    gpus: int  # per node
    nodes: int
    gpu_mem: int  # bytes per GPU (80 GiB where the class does not say)
    checked: bool  # the card's size is known (gpu_mem_gb or --gpu-mem-gb): a peak beyond it is refused
    micro_batch_tokens: int
    checkpointing: bool
    vllm: bool
    weights: int
    lora_state: int
    activations: int  # at micro_batch_tokens, as configured
    activations_checkpointed: int
    activations_full: int
    logits: int
    vllm_total: int  # gpu_memory_utilization x the card
    vllm_weights: int
    vllm_kv: int
    kv_one_sequence: int  # the KV cache vLLM needs to start (one sequence of max_model_len)
    max_model_len: int
    peak_asleep: int  # the update with vLLM asleep
    peak_resident: int  # the update with vLLM resident
    peak_rollout: int  # the rollout: the rescoring forward with vLLM awake, or the transformers engine's decode
    memory: Memory
    step_s: float
    step_parts: dict  # seconds per step of one rank: decode, tail, prefill, recompute, rescore, update, overhead
    steps: int
    gpu_hours: float
    decode_tok_s: float
    concurrency: float  # sequences vLLM decodes at once: max_num_seqs, or what its KV cache holds
    signal: float  # share of generated groups that pass the filter (throughput.signal_rate)
    generated_chains: float  # per step, all ranks: G first answers per generated tree, K G more per expanded one
    generated_tokens: float  # per step, all ranks
    trained_tokens: float  # per step, all ranks
    checkpoint_bytes: int
    save_every: int
    runtime_min: int
    signal_s: int
    attempts: int
    preempted: float  # share of the generated sequences vLLM preempts and recomputes
    waves: int  # engine calls per step (each with its tail)
    rescored_tokens: float  # per step, all ranks: the rescoring's row tokens, contexts and padding included
    update_buckets: int  # bucket lengths the update's rows meet in an attempt (flex: forward + backward each)
    rescore_buckets: int  # bucket lengths the rescoring's rows meet in an attempt (flex: a forward each)
    graphs: int  # flex graphs compiled per attempt (0 without the compiled kernel)
    start_s: float  # seconds to start each attempt (model, vLLM's engine, flex attention's compiles)
    train_s: float  # seconds of all steps and their checkpoints, over all attempts


@dataclass
class EvalPlan:
    run: str
    benchmark: str
    shape: Shape
    gpus: int
    gpu_mem: int
    checked: bool
    vllm_total: int
    vllm_weights: int
    vllm_kv: int
    kv_one_sequence: int
    max_model_len: int
    memory: Memory
    decode_tok_s: float
    concurrency: float
    preempted: float  # share of the sequences vLLM preempts and recomputes
    seconds: float
    gpu_hours: float
    runtime_min: int


def _gib(x: float) -> float:
    return x / GIB


def train_config(m: Matrix, run: str, overrides: dict | None = None):
    """The TrainConfig a training run will get from the workflow (before the plan's save_every),
    with `overrides` (what-if settings, e.g. another micro_batch_tokens)."""
    from bfspo.training.config import TrainConfig

    known = {f.name for f in fields(TrainConfig)}
    settings = jobs.train_settings(m, run) | (overrides or {})
    return TrainConfig(**{k: v for k, v in settings.items() if k in known})


def plannable(m: Matrix, run: str, stage: str) -> bool:
    """A job on GPUs whose model's shapes are known before the run (not built by this workflow)."""
    model = m.config["models"][m.model_of(run)]
    return jobs.gpus(m, run, stage) > 0 and model["path"] not in m.built_model_paths()


def gpu_memory_bytes(m: Matrix, run: str, override_gb: float | None = None) -> int | None:
    gb = override_gb if override_gb is not None else m.size_class(run).get("gpu_mem_gb")
    return None if gb is None else int(gb * GIB)


def plan_train(m: Matrix, run: str, a: Assumptions = ASSUMPTIONS, gpu_mem_gb: float | None = None,
               overrides: dict | None = None) -> TrainPlan:
    """The plan of one training run (see the module doc); the job must be `plannable`."""
    mem = gpu_memory_bytes(m, run, gpu_mem_gb)
    return plan_train_config(
        train_config(m, run, overrides), run=run, gpus=jobs.gpus(m, run, "train"), nodes=jobs.nodes(m, run, "train"),
        ranks=jobs.ranks(m, run), gpu_mem=mem, cap_min=m.size_class(run)["train_runtime"], a=a)


def plan_train_config(cfg, *, run: str, gpus: int, nodes: int, ranks: int, gpu_mem: int | None, cap_min: int,
                      a: Assumptions = ASSUMPTIONS) -> TrainPlan:
    """The plan of one TrainConfig on `gpus` GPUs per node of `gpu_mem` bytes (None: 80 GiB, not
    checked), `ranks` data-parallel ranks per node, time limits of at most `cap_min` minutes."""
    s = load_shape(cfg.model)
    b = GPU_DTYPE_BYTES
    world = ranks * nodes
    card = gpu_mem if gpu_mem is not None else 80 * GIB
    targets = list(cfg.lora_target_modules)
    n_lora = memory.lora_params(s, cfg.lora_r, targets)
    T = cfg.micro_batch_tokens

    # memory, per GPU
    weights = memory.weights(s, b)
    lora = memory.lora_state(n_lora)
    act_ckpt = memory.activations(s, T, b, cfg.lora_r, targets, checkpointing=True)
    act_full = memory.activations(s, T, b, cfg.lora_r, targets, checkpointing=False)
    act = act_ckpt if cfg.gradient_checkpointing else act_full
    logits = memory.logits_chunk(s, HEAD_CHUNK_ROWS, b)
    prompt_mean, prompt_max = a.prompt(cfg.benchmark)
    max_model_len = prompt_max + cfg.budget
    vllm = cfg.engine == "vllm"
    max_num_seqs = getattr(cfg, "max_num_seqs", cfg.rollout_batch_size)
    if vllm:
        vllm_total = int(cfg.gpu_memory_utilization * card)
        vllm_weights = memory.weights(s, b)
        workspace = memory.vllm_workspace(s, max_num_seqs, VLLM_BATCHED_TOKENS, b)
        vllm_kv = vllm_total - vllm_weights - workspace
        asleep = VLLM_ASLEEP + CUDA_CONTEXT
        awake = vllm_total + CUDA_CONTEXT
    else:
        vllm_total = vllm_weights = vllm_kv = asleep = awake = 0
    kv_one = max_model_len * memory.kv_cache_per_token(s, b)
    base = {"weights": weights, "LoRA+AdamW": lora, "CUDA": CUDA_CONTEXT}
    update = base | {f"activations@{T}": act,
                     "logits": memory.update_logits(s, T, b, cfg.lora_r, targets, cfg.gradient_checkpointing,
                                                    HEAD_CHUNK_ROWS)}
    # the rollout's peak: vLLM's samples rescored on the training side with vLLM awake, or the
    # transformers engine's decode (its samples carry their log-probs: it runs no rescoring forward)
    if vllm:
        rollout = base | {f"forward@{T}": memory.forward_activations(s, T, b), "logits": logits, "vLLM": awake}
        phases = {"rescoring, vLLM awake": rollout, "update, vLLM asleep": update | {"vLLM asleep": asleep}}
    else:
        rollout = base | memory.hf_decode(s, cfg.rollout_batch_size, max_model_len, b)
        phases = {"generation, transformers engine": rollout, "update": update}
    peak_phase = max(phases, key=lambda p: sum(phases[p].values()))
    mem_plan = Memory(terms=phases[peak_phase], peak=sum(phases[peak_phase].values()), phase=peak_phase)

    # time, per rank
    keep = signal_rate(cfg.group_size, cfg.k, cfg.filter, a.accuracy(cfg.benchmark))
    rate = ask_rate(cfg.sampling, KeepRate(a.keep_rate_estimate * keep, 1.0), cfg.oversample)
    round_shares = generation_rounds(keep, rate, cfg.max_gen_rounds)
    rounds = sum(round_shares)
    chains_per_tree = cfg.group_size * (cfg.k + 1)
    answer = a.answer_tokens(cfg.benchmark, cfg.budget)
    tree_tokens = cfg.group_size * (cfg.k + 1) * answer * chain_tokens_factor(cfg.k, a)
    trees_trained = cfg.train_batch_chains / chains_per_tree
    trees_generated = trees_trained * rounds
    expanded = expanded_share(cfg.k, cfg.filter, keep)
    generated_chains = trees_generated * cfg.group_size * (1 + expanded * cfg.k)
    generated_per_tree = answer * generated_chain_tokens(cfg.group_size, cfg.k, expanded, a)
    generated = trees_generated * generated_per_tree
    trained = trees_trained * (prompt_mean + tree_tokens)
    streamed = resolve_rollout(cfg.rollout, cfg.engine) == "streamed"
    concurrency = max_num_seqs
    preempted = 0.0
    if vllm and vllm_kv > 0:
        kv_tokens = vllm_kv / memory.kv_cache_per_token(s, b)
        concurrency = min(max_num_seqs, kv_tokens / (prompt_mean + answer))
        preempted = preempted_share(max_num_seqs, kv_tokens, prompt_mean + answer)
    # engine calls per step, each ending with its tail: K + 1 lockstep waves per generation round, or
    # one engine loop that trees and questions join as others finish (streamed), drained once
    waves = 1 if streamed else len(round_shares) * (cfg.k + 1)
    context = prompt_mean + answer / 2
    flex = cfg.tree_attention in ("auto", "flex")  # the compiled kernel, on CUDA
    held = streamed and flex  # finished groups wait to share padded rows; unpadded, each goes alone at once
    decoding = concurrency * (1 - PENDING_SHARE / 2) if vllm and held else concurrency  # groups waiting
    decode_tps = decode_tokens_per_s(s, max(decoding, 1), context, a, b, lora=True)
    sequences = generated_chains / world

    # the rescoring (vLLM): one tree per group, its context once (a line-2 group's prompt, an
    # expansion's prompt and prefix), groups packed into rows of T, each padded to its bucket
    step = cfg.attention_bucket
    groups = trees_generated * (1 + expanded * cfg.k)
    contexts = trees_generated * (prompt_mean * (1 + expanded * cfg.k)
                                  + expanded * cfg.k * (1 - a.expansion_share) * answer)
    group_row = (contexts + generated) / groups
    group_answers = generated / groups / answer
    per_call = (max(1.0, PENDING_SHARE * concurrency / cfg.group_size) if held
                else 1.0 if streamed else groups / world / waves)  # groups rescored together
    calls = groups / world / per_call
    rows = calls * math.ceil(per_call * group_row / T) + (concurrency / (2 * cfg.group_size) if held else 0)
    rescored = rescored_row_tokens(contexts + generated, rows * world, step, flex) if vllm else 0.0

    def spread(answers: float) -> float:
        return a.answer_cv * answer * math.sqrt(answers)

    trees_per_minibatch = cfg.mini_batch_chains / chains_per_tree / world
    update_buckets = buckets_met(row_length_ranges(trees_per_minibatch, prompt_mean + tree_tokens,
                                                   spread(trees_per_minibatch * tree_tokens / answer), T), T, step)
    rescore_ranges = row_length_ranges(per_call, group_row, spread(per_call * group_answers), T)
    if held:  # the drain's rows: one group each
        rescore_ranges += row_length_ranges(1, group_row, spread(group_answers), T)
    rescore_buckets = buckets_met(rescore_ranges, T, step) if vllm else 0
    graphs = compiled_graphs(update_buckets, rescore_buckets) if flex else 0
    parts = {"decode": generated / world / decode_tps,
             "tail": waves * wave_tail_s(s, cfg.budget, answer, max(concurrency, 1), context, a, b, lora=True),
             "prefill": forward_s(s, trees_generated * prompt_mean / world, 2, a),  # once per question
             "recompute": forward_s(s, recompute_tokens(sequences, preempted, prompt_mean, answer), 2, a),
             "rescore": forward_s(s, rescored / world, 2, a),  # old log-probs and entropies
             "update": forward_s(s, trained / world, 6 if cfg.gradient_checkpointing else 4, a),
             "overhead": a.step_overhead_s}
    step_s = sum(parts.values())
    start = start_s(a, vllm=vllm, graphs=graphs)
    ckpt_bytes = n_lora * (memory.LORA_DTYPE_BYTES + 8) + (1 << 20)  # adapter, AdamW moments, state
    ckpt_s = ckpt_bytes / CHECKPOINT_BYTES_S + 1
    save_every = max(1, math.ceil(ckpt_s / (CHECKPOINT_SHARE * step_s)))
    total_s = cfg.steps * (step_s + ckpt_s / save_every)
    signal_s = min(SIGNAL_MAX_S, math.ceil(SAFETY * (step_s + ckpt_s)))
    runtime_min = min(cap_min, max(MIN_RUNTIME_MIN, math.ceil(SAFETY * (start + total_s + signal_s) / 60)))
    attempts = attempts_within(total_s, start, signal_s, runtime_min)
    gpu_hours = (total_s + attempts * start) * gpus * nodes / 3600
    return TrainPlan(
        run=run, shape=s, gpus=gpus, nodes=nodes, gpu_mem=card, checked=gpu_mem is not None, micro_batch_tokens=T,
        checkpointing=cfg.gradient_checkpointing, vllm=vllm, weights=weights, lora_state=lora, activations=act,
        activations_checkpointed=act_ckpt, activations_full=act_full, logits=logits, vllm_total=vllm_total,
        vllm_weights=vllm_weights, vllm_kv=vllm_kv, kv_one_sequence=kv_one, max_model_len=max_model_len,
        peak_asleep=sum(update.values()) + asleep, peak_resident=sum(update.values()) + awake,
        peak_rollout=sum(rollout.values()), memory=mem_plan, step_s=step_s, step_parts=parts, steps=cfg.steps,
        gpu_hours=gpu_hours, decode_tok_s=decode_tps, concurrency=concurrency, signal=keep,
        generated_chains=generated_chains, generated_tokens=generated,
        trained_tokens=trained, checkpoint_bytes=ckpt_bytes, save_every=save_every, runtime_min=runtime_min,
        signal_s=signal_s, attempts=attempts, preempted=preempted, waves=waves, rescored_tokens=rescored,
        update_buckets=update_buckets, rescore_buckets=rescore_buckets, graphs=graphs, start_s=start, train_s=total_s)


def largest_micro_batch(m: Matrix, run: str, resident: bool, share: float = 0.9, a: Assumptions = ASSUMPTIONS,
                        gpu_mem_gb: float | None = None) -> int:
    """The largest power of two of micro_batch_tokens with which the run's peak stays within `share`
    of its card, vLLM resident during the update or asleep (0: none fits)."""
    best, tokens = 0, 1024
    while tokens <= 1 << 20:
        p = plan_train(m, run, a, gpu_mem_gb, {"micro_batch_tokens": tokens})
        peak = max(p.peak_resident if resident else p.peak_asleep, p.peak_rollout)
        if peak > share * p.gpu_mem:
            break
        best, tokens = tokens, tokens * 2
    return best


def plan_eval(m: Matrix, run: str, bench: str, a: Assumptions = ASSUMPTIONS,
              gpu_mem_gb: float | None = None) -> EvalPlan:
    """The plan of one evaluation (vLLM on `eval_gpus` GPUs); the job must be `plannable`."""
    s = load_shape(m.config["models"][m.model_of(run)]["path"])
    b = GPU_DTYPE_BYTES
    mem = gpu_memory_bytes(m, run, gpu_mem_gb)
    card = mem if mem is not None else 80 * GIB
    ev = EVAL_DEFAULTS | {k: v for k, v in m.evaluation.items() if k in EVAL_DEFAULTS}
    spec = m.config["benchmarks"][bench]
    budget, samples = spec["budget"], spec.get("samples", 1)
    prompt_mean, prompt_max = a.prompt(bench)
    max_model_len = prompt_max + budget
    vllm_total = int(ev["gpu_memory_utilization"] * card)
    vllm_weights = memory.weights(s, b)
    vllm_kv = vllm_total - vllm_weights - memory.vllm_workspace(s, ev["max_num_seqs"], VLLM_BATCHED_TOKENS, b)
    terms = {"vLLM weights": vllm_weights, "KV cache": vllm_kv, "vLLM workspace": vllm_total - vllm_weights - vllm_kv,
             "CUDA context": CUDA_CONTEXT}
    answer = a.answer_tokens(bench, budget)
    questions = min(a.n_questions(bench), m.evaluation.get("limit") or a.n_questions(bench))
    kv_tokens = max(vllm_kv, 0) / memory.kv_cache_per_token(s, b)
    concurrency = min(ev["max_num_seqs"], kv_tokens / (prompt_mean + answer))
    preempted = preempted_share(ev["max_num_seqs"], kv_tokens, prompt_mean + answer)
    lora = run in m.runs  # a trained run's adapter; a zero-shot run has none
    context = prompt_mean + answer / 2
    decode_tps = decode_tokens_per_s(s, max(concurrency, 1), context, a, b, lora)
    sequences = questions * samples
    waves = math.ceil(sequences / (m.evaluation.get("batch_size") or sequences))  # one engine call per batch
    seconds = (sequences * answer / decode_tps + forward_s(s, questions * prompt_mean, 2, a)
               + waves * wave_tail_s(s, budget, answer, max(concurrency, 1), context, a, b, lora)
               + forward_s(s, recompute_tokens(sequences, preempted, prompt_mean, answer), 2, a)
               + start_s(a, vllm=True))
    gpus = jobs.gpus(m, run, "eval")
    cap_min = m.size_class(run)["eval_runtime"]
    return EvalPlan(
        run=run, benchmark=bench, shape=s, gpus=gpus, gpu_mem=card, checked=mem is not None, vllm_total=vllm_total, vllm_weights=vllm_weights,
        vllm_kv=vllm_kv, kv_one_sequence=max_model_len * memory.kv_cache_per_token(s, b), max_model_len=max_model_len,
        memory=Memory(terms=terms, peak=sum(terms.values()), phase="generation"), decode_tok_s=decode_tps,
        concurrency=concurrency, preempted=preempted,
        seconds=seconds, gpu_hours=seconds * gpus / 3600,
        runtime_min=min(cap_min, max(MIN_RUNTIME_MIN, math.ceil(SAFETY * seconds / 60))))


@dataclass
class Plans:
    """The plans of every plannable job of a matrix."""

    train: dict = field(default_factory=dict)  # run -> TrainPlan
    eval: dict = field(default_factory=dict)  # (run, benchmark) -> EvalPlan
    max_attempts: int | None = None  # attempts the Slurm profile gives a job (retries + 1); None: unbounded

    def errors(self) -> list[str]:
        """Why jobs cannot run: a peak beyond the card (naming the largest term), a KV cache that
        cannot hold one sequence, a time limit that does not leave one step."""
        out = []
        for run, p in self.train.items():
            if p.checked and p.memory.peak > p.gpu_mem:
                name, size = p.memory.largest
                out.append(f"train {run}: needs {_gib(p.memory.peak):.1f} GiB per GPU ({p.memory.phase}), more than "
                           f"the {_gib(p.gpu_mem):.0f} GiB of its class; the largest term is {name} "
                           f"({_gib(size):.1f} GiB)" + _advice(name))
            if p.vllm and p.vllm_kv < p.kv_one_sequence:
                out.append(f"train {run}: vLLM's share (gpu_memory_utilization x {_gib(p.gpu_mem):.0f} GiB = "
                           f"{_gib(p.vllm_total):.1f} GiB) leaves {_gib(p.vllm_kv):.1f} GiB of KV cache, less than one "
                           f"sequence of {p.max_model_len} tokens needs ({_gib(p.kv_one_sequence):.2f} GiB); raise "
                           "gpu_memory_utilization")
            if p.attempts == 0:
                out.append(f"train {run}: its time limit ({p.runtime_min} min, the class's train_runtime) leaves no "
                           f"time for one step ({p.step_s / 60:.0f} min) after the start and the warning "
                           f"({p.signal_s} s); raise train_runtime")
            elif self.max_attempts is not None and p.attempts > self.max_attempts:
                out.append(f"train {run}: needs {p.attempts} attempts of its {p.runtime_min} min time limit, more than "
                           f"the {self.max_attempts} that the Slurm profile's retries give (slurm/config.yaml: "
                           f"retries {self.max_attempts - 1}); raise the class's train_runtime to "
                           f"{runtime_for_attempts(p, self.max_attempts)} min or more (if the partition allows it), "
                           f"or retries to {p.attempts - 1}")
        for (run, bench), p in self.eval.items():
            if p.checked and p.memory.peak > p.gpu_mem:
                name, size = p.memory.largest
                out.append(f"evaluate {run} on {bench}: needs {_gib(p.memory.peak):.1f} GiB, more than the "
                           f"{_gib(p.gpu_mem):.0f} GiB of its class; the largest term is {name} ({_gib(size):.1f} GiB)")
            if p.vllm_kv < p.kv_one_sequence:
                out.append(f"evaluate {run} on {bench}: {_gib(p.vllm_kv):.1f} GiB of KV cache is less than one "
                           f"sequence of {p.max_model_len} tokens needs ({_gib(p.kv_one_sequence):.2f} GiB); raise "
                           "evaluation.gpu_memory_utilization")
        return out


def attempts_within(train_s: float, start_s: float, signal_s: int, runtime_min: int) -> int:
    """Attempts a run of `train_s` seconds of training needs with a time limit of `runtime_min`:
    each attempt trains for the limit less its start and the warning (0: not one step's room)."""
    usable_s = runtime_min * 60 - start_s - signal_s
    return math.ceil(train_s / usable_s) if usable_s > 0 else 0


def runtime_for_attempts(p: TrainPlan, attempts: int) -> int:
    """The shortest time limit (min) with which the run needs at most `attempts` attempts: each
    attempt trains for the limit less its start and the warning."""
    return math.ceil((p.train_s / attempts + p.start_s + p.signal_s) / 60)


def _advice(term: str) -> str:
    if term.startswith("activations"):
        return "; lower micro_batch_tokens, or turn gradient_checkpointing on"
    if term.startswith("vLLM"):
        return "; lower gpu_memory_utilization"
    return "; this model needs a larger GPU (or tensor parallelism)"


def plan_matrix(m: Matrix, a: Assumptions = ASSUMPTIONS, gpu_mem_gb: float | None = None,
                max_attempts: int | None = -1) -> Plans:
    """The plans of every plannable train and evaluate job of the matrix; a run may take at most
    `max_attempts` attempts (-1: as the Slurm profile's retries allow, jobs.profile_attempts)."""
    plans = Plans(max_attempts=jobs.profile_attempts() if max_attempts == -1 else max_attempts)
    for run in m.runs:
        if plannable(m, run, "train"):
            plans.train[run] = plan_train(m, run, a, gpu_mem_gb)
    for run, bench in m.evaluations():
        if plannable(m, run, "eval"):
            plans.eval[(run, bench)] = plan_eval(m, run, bench, a, gpu_mem_gb)
    return plans
