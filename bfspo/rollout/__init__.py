"""Rollout engines: sample n continuations of many contexts, with per-token log-probs (and
entropies where the engine has the full distribution).

`make_engine` picks one by name; each engine module is imported only when chosen, so vLLM is never
imported unless `engine: vllm` is asked for.
"""

from __future__ import annotations

from bfspo.errors import BfspoError
from bfspo.rollout.base import RolloutEngine


def make_engine(name: str, model, tokenizer, **kw) -> RolloutEngine:
    """The engine called `name`: "transformers" or "vllm" (vLLM is imported only here, when chosen)."""
    if name == "transformers":
        from bfspo.rollout.hf_engine import TransformersEngine

        return TransformersEngine(model, tokenizer, **kw)
    if name == "vllm":
        from bfspo.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(model, tokenizer, **kw)
    raise BfspoError(f"unknown engine {name!r}: choose 'transformers' or 'vllm'")
