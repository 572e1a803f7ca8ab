"""What every rollout engine shares: the `Completion` record, the `RolloutEngine` protocol and the
checks of sampling arguments.

Log-probs and entropies are those of pi_old: taken from the model's raw logits at temperature 1,
before top-p, in float32. They are the numbers the trainer needs for the importance ratio (Eq. 5)
and for entropy-based backtracking (Sec. 3.2), whatever temperature or top-p the sampling used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from bfspo.errors import BfspoError


def request_seed(seed: int, *place: int) -> int:
    """The seed of the sample at `place` (a search tree's question, iteration and child) of work
    seeded `seed`: a hash of all, so that no two samples share a random stream (plain seed + index
    would give neighbouring places, and consecutive seeds, the same streams shifted). 62 bits."""
    return int(np.random.SeedSequence([seed, *place]).generate_state(1, np.uint64)[0] >> np.uint64(2))


GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def stream_uniforms(seeds: np.ndarray, index: int) -> np.ndarray:
    """Draw `index` (0, 1, ...) of the random stream of each seed, uniform in [0, 1), as float64: the
    splitmix64 generator (Steele, Lea and Flood, 2014), whose draw i of seed s is a fixed mix of
    s + (i + 1) * GOLDEN. A draw depends on its seed and index only, so a sample's noise does not
    depend on which other samples share its batch; uint64 arithmetic wraps the same on every CPU."""
    with np.errstate(over="ignore"):
        z = np.asarray(seeds, dtype=np.uint64) + np.uint64(index + 1) * GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


@dataclass
class Completion:
    """One sampled continuation of a context."""

    token_ids: list[int]  # generated tokens, EOS included if the model stopped
    logprobs: list[float]  # log pi(token_t | context, tokens_<t): raw logits, temperature 1, before top-p
    entropies: list[float]  # entropies[t]: entropy of the full distribution token t was drawn from
    finished: bool  # True when the completion ended with EOS (not cut by the budget)


@dataclass
class Occupancy:
    """How full an engine ran: the sequences it decoded per decode step, over `capacity`, the most
    it decodes at once (vLLM's max_num_seqs, the transformers engine's batch). A running sequence
    makes one token per step, so its sequence-steps are its tokens."""

    capacity: int
    steps: int = 0
    running: int = 0  # sequence-steps: the sequences of each step, summed

    def record(self, steps: int, sequence_steps: int) -> None:
        self.steps += steps
        self.running += sequence_steps

    def pop(self) -> dict:
        """Since the last call: `engine_steps` and `occupancy`, the mean sequences per step over
        `capacity` (NaN without a step); then starts counting again."""
        out = {"engine_steps": self.steps,
               "occupancy": self.running / (self.steps * self.capacity) if self.steps else float("nan")}
        self.steps = self.running = 0
        return out


class RolloutEngine(Protocol):
    def generate(self, contexts: Sequence[Sequence[int]], n: int, max_new_tokens: Sequence[int] | int, *,
                 temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None,
                 keys: Sequence[tuple[int, ...]] | None = None) -> list[list[Completion]]:
        """n completions per context (contexts are full token ids: prompt + prefix); temperature 0 = greedy.

        `keys[i]`: the place of context i in the caller's work (a search tree's (question, iteration));
        an engine that seeds each request seeds sample j of context i by (seed, *keys[i], j), so a
        sample does not depend on which other contexts share the call. Default: (i,)."""

    def pop_occupancy(self) -> dict:
        """`Occupancy.pop` of the engine's decode steps since the last call."""

    def sync_weights(self, model) -> None:
        """Make the engine sample from `model`'s current weights."""

    def sleep(self) -> None:
        """Give up the engine's accelerator memory while the trainer updates the model (a no-op for an
        engine that holds none of its own). No generate or sync_weights until `wake_up`."""

    def wake_up(self) -> None:
        """Take back what `sleep` gave up. The trainer's order around an update is
        sleep -> update -> wake_up -> sync_weights -> generate."""


def needed_model_len(prompt_lengths: Sequence[int], budget: int) -> int:
    """The longest sequence an engine must hold: the longest prompt plus the generation budget (a
    search tree's contexts are a prompt plus a prefix, and the prefix comes out of the budget)."""
    return max(prompt_lengths) + budget


def per_context_budgets(max_new_tokens: Sequence[int] | int, n_contexts: int) -> list[int]:
    """One generation budget per context from an int or a per-context sequence."""
    budgets = [max_new_tokens] * n_contexts if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(budgets) != n_contexts:
        raise ValueError(f"max_new_tokens has {len(budgets)} entries for {n_contexts} contexts")
    if any(not isinstance(b, int) or b < 0 for b in budgets):
        raise ValueError(f"max_new_tokens must be non-negative integers, got {budgets}")
    return budgets


def context_keys(keys: Sequence[Sequence[int]] | None, n_contexts: int) -> list[tuple[int, ...]]:
    """Each context's place (`RolloutEngine.generate`'s `keys`), as tuples; default (i,) for context i."""
    out = [(i,) for i in range(n_contexts)] if keys is None else [tuple(k) for k in keys]
    if len(out) != n_contexts:
        raise ValueError(f"{len(out)} keys for {n_contexts} contexts")
    return out


def check_sampling_args(contexts: Sequence[Sequence[int]], n: int, temperature: float, top_p: float) -> None:
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if any(len(c) == 0 for c in contexts):
        raise ValueError("every context needs at least one token")


def eos_token_ids(tokenizer, model=None) -> set[int]:
    """The tokenizer's EOS id together with every EOS id of the model's generation config."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if config_eos is not None:
        ids.update([config_eos] if isinstance(config_eos, int) else config_eos)
    if not ids:
        raise BfspoError("the tokenizer and the model's generation config define no EOS token")
    return ids
