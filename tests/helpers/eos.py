"""Make a random tiny model end some of its answers, and say some numbers, as a real model does."""

from __future__ import annotations

import torch


def favour_tokens(model, favoured: dict[int, float], level: float, eos_token_id: int | None = None) -> None:
    """Raise the logits of chosen tokens by a steady amount at every position of a random model
    with tied embeddings.

    Every input embedding gets `level` in hidden dimension 0, which the residual stream carries to
    the final norm; each favoured token gets its own value there instead. Its logit then exceeds
    what it would be by about h_0 * (value - level), whatever the prefix, and the other tokens keep
    their relative order. A random model otherwise almost never emits EOS, so every chain is cut
    off by the budget and, being unfinished, scored wrong.
    """
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb[:, 0] = level
        if eos_token_id is not None:  # EOS embeds along dimension 0 alone: it ends answers at a steadier rate
            emb[eos_token_id] = 0.0
        for token, value in favoured.items():
            emb[token, 0] = value
