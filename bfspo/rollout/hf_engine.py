"""The transformers rollout engine: batched sampling with a causal LM (plain or peft-wrapped) that
shares the trained model object, on CPU or GPU. It is the fallback where vLLM is missing.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch

from bfspo.rollout.base import (
    Completion,
    Occupancy,
    check_sampling_args,
    context_keys,
    eos_token_ids,
    per_context_budgets,
    request_seed,
    stream_uniforms,
)


def logprobs_and_entropy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-softmax and entropy of each row of `logits` (..., V), in float32.

    H = -sum_v p_v log p_v, computed as a batched dot product so that p * log p is never stored.
    Half-precision logits are cast once and normalised in place; `logits` itself is never changed.
    """
    as_float = logits.float()
    lse = torch.logsumexp(as_float, dim=-1, keepdim=True)
    logp = as_float.sub_(lse) if as_float is not logits else as_float - lse
    entropy = -(logp.exp().unsqueeze(-2) @ logp.unsqueeze(-1)).squeeze(-1).squeeze(-1)
    return logp, entropy


def sample_next(logp: torch.Tensor, temperature: float, top_p: float, uniforms: torch.Tensor | None) -> torch.Tensor:
    """Draw one token per row from softmax(logp / temperature) restricted to the top-p nucleus.

    Temperature 0 is greedy (argmax). The nucleus keeps the most probable tokens whose cumulative
    mass before them is below top_p, so it always holds at least the argmax. With `uniforms` (one
    draw in [0, 1) per row) a row takes the token where its draw falls in the cumulative
    distribution (inverse transform sampling, in float64), so its token depends on its own draw
    and logits only; without, torch's global generator draws them.
    """
    if temperature == 0:
        return logp.argmax(dim=-1)
    probs = torch.softmax(logp / temperature, dim=-1)
    if top_p < 1:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        outside = sorted_p.cumsum(dim=-1) - sorted_p >= top_p
        probs = probs.scatter(-1, order, sorted_p.masked_fill(outside, 0.0))
    if uniforms is None:
        return torch.multinomial(probs, 1).squeeze(-1)
    cdf = probs.double().cumsum(dim=-1)
    where = (uniforms.to(cdf) * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, where, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


@contextmanager
def rollout_mode(model: torch.nn.Module):
    """No dropout and no autograd while sampling; every module's train/eval flag is restored after.

    The flags are put back one by one (not with model.train()), so the caller's mix of modes and
    every parameter's requires_grad are left exactly as they were.
    """
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, flag in flags:
            m.training = flag


class TransformersEngine:
    """Batched sampling with a transformers causal LM (plain or peft-wrapped), on CPU or GPU.

    Each context is prefilled once; its KV cache is then repeated n times along the batch
    (a copy, no recompute) for its n continuations, which a lean decode loop extends one token at
    a time. Contexts are left-padded, with an attention mask and per-row position ids. Rows stop at
    EOS or at their context's budget and leave the batch, so short rows cost nothing after they end.
    Given a seed, each sample draws from its own random stream (`generate`).

    batch_size: the most sequences (contexts x n) decoded at once; the n continuations of one
      context always run together, even when n > batch_size.
    """

    def __init__(self, model, tokenizer, batch_size: int = 64):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.occupancy = Occupancy(batch_size)
        self.eos_ids = eos_token_ids(tokenizer, model)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids)

    def pop_occupancy(self) -> dict:
        return self.occupancy.pop()

    def sync_weights(self, model) -> None:
        """Nothing to copy: the engine samples from the very model object that is trained."""
        self.model = model

    def sleep(self) -> None:
        """Nothing to free: the engine's only memory is the trained model's."""

    def wake_up(self) -> None:
        """Nothing to take back (see `sleep`)."""

    def generate(self, contexts, n, max_new_tokens, *, temperature=1.0, top_p=1.0, seed=None, keys=None):
        """n samples of every context, each seeded by its place: sample j of context i draws from
        the stream of `request_seed(seed, *keys[i], j)` (keys default (i,)), as vLLM's per-request
        seeds do, so a sample does not depend on which other contexts share the call (to the
        rounding of batched logits). No seed: torch's global generator."""
        check_sampling_args(contexts, n, temperature, top_p)
        budgets = per_context_budgets(max_new_tokens, len(contexts))
        keys = context_keys(keys, len(contexts))
        results: list[list[Completion]] = [[Completion([], [], [], False) for _ in range(n)] for _ in contexts]
        device = next(self.model.parameters()).device
        # Longest first, so each chunk holds contexts of similar length (little padding).
        todo = sorted((i for i in range(len(contexts)) if budgets[i] > 0), key=lambda i: -len(contexts[i]))
        per_chunk = max(1, self.batch_size // n)
        with rollout_mode(self.model):
            for start in range(0, len(todo), per_chunk):
                chunk = todo[start:start + per_chunk]
                seeds = None if seed is None or temperature == 0 else \
                    np.array([request_seed(seed, *keys[i], j) for i in chunk for j in range(n)], dtype=np.uint64)
                done = self._generate_chunk([contexts[i] for i in chunk], [budgets[i] for i in chunk], n,
                                            temperature, top_p, seeds, device)
                for i, completions in zip(chunk, done):
                    results[i] = completions
        return results

    def _generate_chunk(self, contexts, budgets, n, temperature, top_p, seeds, device):
        from transformers import DynamicCache

        lengths = torch.tensor([len(c) for c in contexts], device=device)
        width = int(lengths.max())
        input_ids = torch.full((len(contexts), width), self.pad_id, dtype=torch.long, device=device)
        mask = torch.zeros((len(contexts), width), dtype=torch.long, device=device)
        for row, ctx in enumerate(contexts):
            input_ids[row, width - len(ctx):] = torch.tensor(list(ctx), device=device)
            mask[row, width - len(ctx):] = 1
        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        # Share each context's prefill among its n continuations: row r continues context r // n.
        logits = out.logits[:, -1].repeat_interleave(n, dim=0)
        cache.batch_repeat_interleave(n)
        mask = mask.repeat_interleave(n, dim=0)
        positions = lengths.repeat_interleave(n)
        seq = torch.arange(len(contexts) * n, device=device)  # active row -> sequence index
        limit = torch.tensor(budgets, device=device).repeat_interleave(n)
        eos = torch.tensor(sorted(self.eos_ids), device=device)
        out_tokens = [[] for _ in range(len(contexts) * n)]
        out_logprobs = [[] for _ in range(len(contexts) * n)]
        out_entropies = [[] for _ in range(len(contexts) * n)]
        finished = [False] * (len(contexts) * n)
        step = 0
        while True:
            self.occupancy.record(1, len(seq))
            logp, entropy = logprobs_and_entropy(logits)
            rows = seq.tolist()
            draws = None if seeds is None else torch.from_numpy(stream_uniforms(seeds[rows], step))
            tokens = sample_next(logp, temperature, top_p, draws)
            token_logp = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
            step += 1
            stopped_eos = torch.isin(tokens, eos)
            stop = stopped_eos | (limit[seq] <= step)
            for s, t, lp, h, fin in zip(rows, tokens.tolist(), token_logp.tolist(), entropy.tolist(),
                                        stopped_eos.tolist()):
                out_tokens[s].append(t)
                out_logprobs[s].append(lp)
                out_entropies[s].append(h)
                finished[s] = fin
            if bool(stop.any()):
                keep = (~stop).nonzero().squeeze(-1)
                if keep.numel() == 0:
                    break
                cache.batch_select_indices(keep)
                seq, tokens, mask, positions = seq[keep], tokens[keep], mask[keep], positions[keep]
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
            out = self.model(input_ids=tokens.unsqueeze(-1), attention_mask=mask, position_ids=positions.unsqueeze(-1),
                             past_key_values=cache, use_cache=True)
            positions = positions + 1
            logits = out.logits[:, -1]
        completions = [Completion(out_tokens[s], out_logprobs[s], out_entropies[s], finished[s])
                       for s in range(len(contexts) * n)]
        return [completions[c * n:(c + 1) * n] for c in range(len(contexts))]
