"""RescoredEngine: the training side restores log-probs and the full-distribution entropies that an
engine like vLLM does not return."""

import math

import torch

from bfspo.rollout.base import Completion
from bfspo.rollout.hf_engine import TransformersEngine
from bfspo.model_io import load_model
from bfspo.rollout.rescore import RescoredEngine


class TopKOnly:
    """Wraps an engine and drops what vLLM cannot give: entropies (and exact log-probs)."""

    def __init__(self, engine):
        self.engine = engine

    def sync_weights(self, model):
        self.engine.sync_weights(model)

    def generate(self, contexts, n, max_new_tokens, **kw):
        out = self.engine.generate(contexts, n, max_new_tokens, **kw)
        return [[Completion(c.token_ids, [0.0] * len(c.token_ids), [math.nan] * len(c.token_ids), c.finished)
                 for c in comps] for comps in out]


def test_rescored_values_match_the_engine(tiny_model_dir):
    model, tok = load_model(str(tiny_model_dir))
    engine = TransformersEngine(model, tok)
    contexts = [tok("Tom has 3 apples.")["input_ids"], tok("A shop sells 12 pens a day")["input_ids"], [5]]
    budgets = [6, 9, 0]
    reference = engine.generate(contexts, 3, budgets, seed=7)
    rescored = RescoredEngine(TopKOnly(engine), model, contexts_per_forward=2).generate(contexts, 3, budgets, seed=7)
    for ref_comps, new_comps in zip(reference, rescored):
        for ref, new in zip(ref_comps, new_comps):
            assert new.token_ids == ref.token_ids
            torch.testing.assert_close(torch.tensor(new.logprobs), torch.tensor(ref.logprobs), atol=1e-5, rtol=0)
            if ref.token_ids:
                assert math.isnan(new.entropies[0])
                torch.testing.assert_close(torch.tensor(new.entropies[1:]), torch.tensor(ref.entropies[1:]),
                                           atol=1e-5, rtol=0)
    assert reference[2] == rescored[2] and not rescored[2][0].token_ids
