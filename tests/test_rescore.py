"""RescoredEngine: the training side restores log-probs and the full-distribution entropies that an
engine like vLLM does not return, in micro-batches, in eval mode, and measures the engine's gap;
make_engine wraps vLLM in it for training only."""

import copy
import math

import pytest
import torch

from bfspo.algorithm.attention_options import BUCKET_TOKENS, bucket_lengths
from bfspo.model_io import load_model
from bfspo.rollout import make_engine, rescore
from bfspo.rollout.base import Completion
from bfspo.rollout.hf_engine import TransformersEngine
from bfspo.rollout.rescore import RescoredEngine

OFFSET = 0.25


class TopKOnly:
    """Wraps an engine and drops what vLLM cannot give: entropies, and log-probs in the trainer's
    numerics (here shifted by OFFSET)."""

    def __init__(self, engine):
        self.engine = engine

    def sync_weights(self, model):
        self.engine.sync_weights(model)

    def generate(self, contexts, n, max_new_tokens, **kw):
        out = self.engine.generate(contexts, n, max_new_tokens, **kw)
        return [[Completion(c.token_ids, [lp + OFFSET for lp in c.logprobs], [math.nan] * len(c.token_ids), c.finished)
                 for c in comps] for comps in out]


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    """A LoRA policy whose dropout changes its outputs in train mode."""
    from peft import LoraConfig, get_peft_model

    model, tok = load_model(str(tiny_model_dir))
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.5, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))
    return peft, tok


@pytest.mark.parametrize("budget", [10_000, 40])
def test_rescored_values_match_the_engine(policy, budget):
    """Budget 40 cuts each context's group into pieces; the policy is left in train mode, and the
    rescoring still runs without dropout (and leaves the mode as it found it)."""
    model, tok = policy
    engine = TransformersEngine(model, tok)
    contexts = [tok("Tom has 3 apples.")["input_ids"], tok("A shop sells 12 pens a day")["input_ids"], [5]]
    budgets = [6, 20, 0]
    reference = engine.generate(contexts, 3, budgets, seed=7)
    rescoring = RescoredEngine(TopKOnly(engine), model, micro_batch_tokens=budget)
    model.train()
    rescored = rescoring.generate(contexts, 3, budgets, seed=7)
    assert model.training and all(m.training for m in model.modules())
    model.eval()
    for ref_comps, new_comps in zip(reference, rescored):
        for ref, new in zip(ref_comps, new_comps):
            assert new.token_ids == ref.token_ids
            torch.testing.assert_close(torch.tensor(new.logprobs), torch.tensor(ref.logprobs), atol=1e-5, rtol=0)
            if ref.token_ids:
                assert math.isnan(new.entropies[0])
                torch.testing.assert_close(torch.tensor(new.entropies[1:]), torch.tensor(ref.entropies[1:]),
                                           atol=1e-5, rtol=0)
    assert reference[2] == rescored[2] and not rescored[2][0].token_ids
    stats = rescoring.pop_stats()
    assert stats["gap_count"] == sum(len(c.token_ids) for comps in reference for c in comps)
    assert stats["gap_sum"] / stats["gap_count"] == pytest.approx(OFFSET, abs=1e-5)
    assert stats["gap_max"] == pytest.approx(OFFSET, abs=1e-5) and stats["seconds"] > 0
    assert (stats["rows"] == 1) == (budget == 10_000) and stats["row_tokens"] == stats["tokens"]  # shared; no flex
    assert rescoring.pop_stats() == {"gap_sum": 0.0, "gap_max": 0.0, "gap_count": 0, "seconds": 0.0, "rows": 0,
                                     "tokens": 0, "row_tokens": 0}


class FakeVLLM:
    def __init__(self, model, tokenizer, **kw):
        self.model, self.kw = model, kw


def test_make_engine_rescores_vllm_for_training_only(policy, monkeypatch):
    import bfspo.rollout.vllm_engine as vllm_engine

    model, tok = policy
    monkeypatch.setattr(vllm_engine, "VLLMEngine", FakeVLLM)
    training = make_engine("vllm", model, tok, micro_batch_tokens=4096, batch_size=8)
    assert isinstance(training, RescoredEngine) and training.micro_batch_tokens == 4096
    assert isinstance(training.engine, FakeVLLM) and training.engine.kw == {"batch_size": 8}
    evaluation = make_engine("vllm", None, tok, model_path="m", batch_size=8)
    assert isinstance(evaluation, FakeVLLM)
    assert isinstance(make_engine("transformers", model, tok, micro_batch_tokens=4096), TransformersEngine)
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        make_engine("vllm", model, tok)


def _rescored(model, tok, contexts, groups, budget, together, step=None):
    """Copies of `groups` rescored by a fresh RescoredEngine: all contexts in one call (shared rows) or
    one call per context (a row each, as before issue 38); its stats."""
    rescoring = RescoredEngine(None, model, micro_batch_tokens=budget, attention="blockwise",
                               bucket=step or BUCKET_TOKENS)
    groups = copy.deepcopy(groups)
    if together:
        rescoring.rescore(contexts, groups)
    else:
        for context, group in zip(contexts, groups):
            rescoring.rescore([context], [group])
    return groups, rescoring.pop_stats()


@pytest.mark.parametrize("padded", [False, True], ids=["rows as they are", "rows padded to buckets"])
def test_packed_rescoring_equals_one_row_per_context(policy, monkeypatch, padded):
    """Issue 38: contexts share rows (first fit, as the update's trees), and each context's log-probs
    and entropies equal those of a row of its own to 1e-5; padded to bucket lengths (as the flex
    kernel's rows are; here with the blockwise kernel, whose numbers padding does not change), the
    shared rows hold at most one bucket of padding each, and no more in all than a row per context."""
    model, tok = policy
    model.eval()
    engine = TopKOnly(TransformersEngine(model, tok))
    texts = ["Tom has 3 apples.", "A shop sells 12 pens a day for 5 days.", "What is 7 times 8?", "Add 2 and 2.",
             "A train leaves at noon and"]
    contexts = [tok(t)["input_ids"] for t in texts]
    groups = engine.generate(contexts, 3, 12, seed=3)
    step = 16
    if padded:
        monkeypatch.setattr(rescore, "row_buckets", lambda attention, device, max_tokens, bucket:
                            bucket_lengths(max_tokens, bucket))
    packed, shared = _rescored(model, tok, contexts, groups, 160, together=True, step=step)
    alone, own = _rescored(model, tok, contexts, groups, 160, together=False, step=step)
    for new_group, ref_group in zip(packed, alone):
        for new, ref in zip(new_group, ref_group):
            assert new.token_ids == ref.token_ids
            torch.testing.assert_close(torch.tensor(new.logprobs), torch.tensor(ref.logprobs), atol=1e-5, rtol=0)
            torch.testing.assert_close(torch.tensor(new.entropies[1:]), torch.tensor(ref.entropies[1:]), atol=1e-5,
                                       rtol=0)
    assert own["rows"] == len(contexts) and shared["rows"] < len(contexts)  # rows shared
    assert shared["tokens"] == own["tokens"] and shared["gap_count"] == own["gap_count"]
    if padded:
        assert 0 <= shared["row_tokens"] - shared["tokens"] < shared["rows"] * step
        assert own["row_tokens"] - own["tokens"] >= shared["row_tokens"] - shared["tokens"]
    else:
        assert shared["row_tokens"] == shared["tokens"]


def test_a_compiler_failure_in_the_rescoring_names_the_way_out(policy, monkeypatch):
    """flex_errors guards the rescoring's forwards as it guards the update's (issue 38)."""
    from torch._dynamo.exc import TorchDynamoException

    from bfspo.errors import BfspoError

    model, tok = policy

    def failing(*args, **kwargs):
        raise TorchDynamoException("ptxas fatal: unsupported GPU")

    monkeypatch.setattr(rescore, "packed_logprobs", failing)
    group = [Completion([5, 6, 7], [-1.0] * 3, [math.nan] * 3, True)]
    with pytest.raises(BfspoError, match="tree_attention: blockwise"):
        RescoredEngine(None, model, micro_batch_tokens=64).rescore([[3, 4]], [group])


def test_rows_are_padded_only_for_the_compiled_flex_kernel(policy):
    """`pads_rows` (issue 47): a streamed rollout shares rows only where they are padded to bucket
    lengths; with the blockwise kernel (CPU's default) each group goes alone."""
    model, _ = policy
    assert RescoredEngine(None, model, micro_batch_tokens=4096, attention="flex").pads_rows
    assert not RescoredEngine(None, model, micro_batch_tokens=4096, attention="blockwise").pads_rows
    assert not RescoredEngine(None, model, micro_batch_tokens=4096).pads_rows  # auto: blockwise on CPU
