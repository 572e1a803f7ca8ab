"""Rollout engines: sample n continuations of many contexts, with per-token log-probs (and
entropies where the engine has the full distribution).

`make_engine` picks one by name, the same way for training and evaluation; each engine module is
imported only when chosen, so vLLM is never imported unless `engine: vllm` is asked for.
"""

from __future__ import annotations

from bfspo.algorithm.attention_options import BUCKET_TOKENS
from bfspo.errors import BfspoError
from bfspo.rollout.base import RolloutEngine


def make_engine(name: str, model, tokenizer, *, micro_batch_tokens: int | None = None, attention: str = "auto",
                bucket: int = BUCKET_TOKENS, **kw) -> RolloutEngine:
    """The engine called `name`: "transformers" or "vllm" (vLLM is imported only here, when chosen).

    Given a training model, vLLM's engine comes wrapped in `RescoredEngine`: vLLM returns neither the
    full-distribution entropies that backtracking needs nor log-probs in the trainer's numerics
    (docs/algorithm.md, "Old log-probs"), so the training model rescores its samples, in
    micro-batches of `micro_batch_tokens` row tokens, through tree attention `attention` with
    flex's rows padded to multiples of `bucket` tokens (TrainConfig `tree_attention`,
    `attention_bucket`). The transformers engine samples from the
    training model itself and returns both exactly: it needs no rescoring. Evaluation (no training
    model, no log-probs used) gets the bare engines.
    """
    if name == "transformers":
        from bfspo.rollout.hf_engine import TransformersEngine

        return TransformersEngine(model, tokenizer, **kw)
    if name == "vllm":
        from bfspo.rollout.vllm_engine import VLLMEngine

        if model is None:
            return VLLMEngine(model, tokenizer, **kw)
        if micro_batch_tokens is None:
            raise ValueError("make_engine: rescoring vLLM's samples with a training model needs micro_batch_tokens")
        from bfspo.rollout.rescore import RescoredEngine

        return RescoredEngine(VLLMEngine(model, tokenizer, **kw), model, micro_batch_tokens, attention, bucket)
    raise BfspoError(f"unknown engine {name!r}: choose 'transformers' or 'vllm'")
