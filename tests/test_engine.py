"""The transformers rollout engine against transformers' own generate and a teacher-forced forward."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bfspo.errors import BfspoError
from bfspo.rollout import make_engine
from bfspo.rollout.base import Completion, request_seed, stream_uniforms
from bfspo.rollout.hf_engine import TransformersEngine, logprobs_and_entropy, rollout_mode, sample_next

TEXTS = ["Tom has 3 apples.", "A shop sells 12 pens a day for 5 days. 12 * 5 = 60. So the answer is", "Let x"]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    """The tiny model with larger random weights: peaked, input-dependent next-token distributions,
    so greedy paths vary and a wrong position id or mask changes the output."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3, generator=gen)
    return model.eval()


@pytest.fixture(scope="module")
def contexts(tokenizer):
    return [tokenizer(t)["input_ids"] for t in TEXTS]


def reference_greedy(model, tokenizer, ctx, max_new_tokens):
    out = model.generate(torch.tensor([ctx]), attention_mask=torch.ones(1, len(ctx), dtype=torch.long),
                         do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
    return out[0, len(ctx):].tolist()


def teacher_forced(model, ctx, completion):
    """float32 log pi(token_t) and entropies of a single, unpadded forward over context + completion."""
    with torch.no_grad():
        logits = model(torch.tensor([ctx + completion.token_ids])).logits[0].float()
    logp = logits.log_softmax(-1)[len(ctx) - 1:-1]
    token_logp = logp.gather(-1, torch.tensor(completion.token_ids)[:, None]).squeeze(-1)
    return token_logp, -(logp.exp() * logp).sum(-1)


def assert_same(a: list[list[Completion]], b: list[list[Completion]]):
    """Equal tokens; log-probs and entropies equal up to float reordering across batch shapes."""
    assert [[c.token_ids for c in r] for r in a] == [[c.token_ids for c in r] for r in b]
    assert [[c.finished for c in r] for r in a] == [[c.finished for c in r] for r in b]
    for field in ("logprobs", "entropies"):
        x = torch.tensor([v for r in a for c in r for v in getattr(c, field)])
        y = torch.tensor([v for r in b for c in r for v in getattr(c, field)])
        torch.testing.assert_close(x, y, atol=1e-5, rtol=0)


def test_greedy_equals_generate(model, tokenizer, contexts):
    results = TransformersEngine(model, tokenizer, batch_size=8).generate(contexts, 2, 24, temperature=0)
    for ctx, (first, second) in zip(contexts, results):
        ref = reference_greedy(model, tokenizer, ctx, 24)
        assert first.token_ids == ref[:len(first.token_ids)]
        assert len(first.token_ids) == 24 or first.finished
        assert_same([[second]], [[first]])  # greedy: the n copies agree
    assert len({tuple(r[0].token_ids) for r in results}) == len(contexts)  # the fixture is not degenerate


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_logprobs_and_entropies_match_teacher_forcing(model, tokenizer, contexts, temperature, top_p):
    """The recorded values are pi_old's: temperature 1, before top-p, whatever the sampling used."""
    results = TransformersEngine(model, tokenizer, batch_size=4).generate(
        contexts, 3, [12, 20, 7], temperature=temperature, top_p=top_p, seed=0)
    for ctx, completions in zip(contexts, results):
        for c in completions:
            assert len(c.logprobs) == len(c.entropies) == len(c.token_ids) > 0
            logp, entropy = teacher_forced(model, ctx, c)
            torch.testing.assert_close(torch.tensor(c.logprobs), logp, atol=1e-5, rtol=0)
            torch.testing.assert_close(torch.tensor(c.entropies), entropy, atol=1e-5, rtol=0)


def test_prefill_runs_once_per_context(model, tokenizer, contexts):
    """n continuations share their context's KV cache: one prefill of (contexts x width), never x n."""
    calls = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, args, out: calls.append(tuple(args[0].shape)))
    try:
        results = TransformersEngine(model, tokenizer, batch_size=64).generate(contexts, 8, 5, seed=0)
    finally:
        hook.remove()
    width = max(len(c) for c in contexts)
    assert calls[0] == (len(contexts), width)
    assert all(shape[1] == 1 for shape in calls[1:])  # every later forward is a one-token decode step
    assert len(calls) == 5  # 1 prefill + 4 decode steps for 5 tokens
    assert all(len(c.token_ids) == 5 or c.finished for r in results for c in r)


def test_batch_size_splits_contexts_and_keeps_results(model, tokenizer, contexts):
    calls = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, args, out: calls.append(tuple(args[0].shape)))
    try:
        small = TransformersEngine(model, tokenizer, batch_size=2).generate(contexts, 2, 6, temperature=0)
    finally:
        hook.remove()
    assert max(shape[0] for shape in calls) == 2  # one context (x n=2) per chunk
    assert_same(small, TransformersEngine(model, tokenizer, batch_size=64).generate(contexts, 2, 6, temperature=0))


def test_seed_makes_sampling_reproducible(model, tokenizer, contexts):
    engine = TransformersEngine(model, tokenizer, batch_size=16)
    a = engine.generate(contexts, 4, 16, seed=7)
    assert engine.generate(contexts, 4, 16, seed=7) == a
    assert engine.generate(contexts, 4, 16, seed=8) != a
    for completions in a:  # continuations share a prefix cache but are sampled independently
        assert len({tuple(c.token_ids) for c in completions}) > 1


def test_per_context_budgets(model, tokenizer, contexts):
    results = TransformersEngine(model, tokenizer).generate(contexts, 2, [0, 3, 9], seed=1)
    assert results[0] == [Completion([], [], [], False)] * 2
    for budget, completions in zip([3, 9], results[1:]):
        for c in completions:
            assert len(c.token_ids) == budget or (c.finished and len(c.token_ids) < budget)
    assert TransformersEngine(model, tokenizer).generate(contexts, 1, 0) == [[Completion([], [], [], False)]] * 3


def test_stops_at_any_eos_id(model, tokenizer, contexts, monkeypatch):
    """generation_config EOS ids count as EOS too; the EOS token is kept and marks the sequence finished."""
    ctx = contexts[1]
    full = TransformersEngine(model, tokenizer).generate([ctx], 1, 20, temperature=0)[0][0].token_ids
    k = next(i for i in range(2, len(full)) if full[i] not in full[:i])
    monkeypatch.setattr(model.generation_config, "eos_token_id", [tokenizer.eos_token_id, full[k]])
    stopped = TransformersEngine(model, tokenizer).generate([ctx], 1, 20, temperature=0)[0][0]
    assert stopped.token_ids == full[:k + 1]
    assert stopped.finished and len(stopped.logprobs) == k + 1


def test_left_padding_gives_the_same_result_as_alone(model, tokenizer, contexts):
    short, long = contexts[2], contexts[1]
    assert len(short) < len(long)
    engine = TransformersEngine(model, tokenizer, batch_size=8)
    together = engine.generate([short, long], 1, 16, temperature=0)
    for ctx, result in zip([short, long], together):
        assert_same([result], engine.generate([ctx], 1, 16, temperature=0))


def test_tiny_top_p_always_takes_the_argmax(model, tokenizer, contexts):
    engine = TransformersEngine(model, tokenizer)
    greedy = engine.generate(contexts, 1, 12, temperature=0)
    for seed in range(3):
        nucleus = engine.generate(contexts, 2, 12, temperature=1.0, top_p=1e-6, seed=seed)
        assert [[c.token_ids for c in r] for r in nucleus] == [[g[0].token_ids] * 2 for g in greedy]


def test_leaves_modes_and_requires_grad_alone(model, tokenizer, contexts):
    """Rollouts run without dropout even when the caller left the model in train mode."""
    greedy = TransformersEngine(model, tokenizer).generate(contexts, 1, 10, temperature=0)
    attention = [m for m in model.modules() if hasattr(m, "attention_dropout")]
    assert attention
    model.train()
    model.lm_head.weight.requires_grad_(False)
    try:
        for m in attention:
            m.attention_dropout = 0.9
        assert_same(TransformersEngine(model, tokenizer).generate(contexts, 1, 10, temperature=0), greedy)
        assert all(m.training for m in model.modules())
        assert [p.requires_grad for p in model.parameters()].count(False) == 1
    finally:
        for m in attention:
            m.attention_dropout = 0.0
        model.lm_head.weight.requires_grad_(True)
        model.eval()


def test_rollout_mode_restores_mixed_flags(model):
    model.model.layers[0].train()
    with rollout_mode(model):
        assert not any(m.training for m in model.modules())
        assert not torch.is_grad_enabled()
    assert model.model.layers[0].training and not model.training
    model.eval()


def test_works_with_a_peft_model(tiny_model_dir, tokenizer, contexts):
    from peft import LoraConfig, get_peft_model

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False))
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    peft_model.train()
    engine = make_engine("transformers", peft_model, tokenizer, batch_size=4)
    engine.sync_weights(peft_model)
    results = engine.generate(contexts, 2, 8, seed=3)
    assert peft_model.training
    assert [n for n, p in peft_model.named_parameters() if p.requires_grad] == trainable
    peft_model.eval()
    for ctx, completions in zip(contexts, results):
        for c in completions:
            logp, _ = teacher_forced(peft_model, ctx, c)
            torch.testing.assert_close(torch.tensor(c.logprobs), logp, atol=1e-5, rtol=0)


def test_logprobs_and_entropy_do_not_modify_their_input():
    logits = torch.randn(3, 50)
    for x in (logits.clone(), logits.to(torch.bfloat16)):
        before = x.clone()
        logp, entropy = logprobs_and_entropy(x)
        assert torch.equal(x, before) and logp.dtype == torch.float32
        ref = x.float().log_softmax(-1)
        torch.testing.assert_close(logp, ref)
        torch.testing.assert_close(entropy, -(ref.exp() * ref).sum(-1))


@pytest.mark.parametrize("seeded", [True, False], ids=["own-draws", "global-generator"])
def test_top_p_samples_only_from_the_nucleus(seeded):
    logp = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().repeat(4000, 1)
    torch.manual_seed(0)

    def draws():
        return torch.from_numpy(stream_uniforms(np.arange(4000, dtype=np.uint64), 3)) if seeded else None
    counts = torch.bincount(sample_next(logp, 1.0, 0.6, draws()), minlength=4).float() / 4000
    assert counts[2] == counts[3] == 0  # 0.5 + 0.3 reaches top_p = 0.6: the rest is cut
    assert abs(counts[0] - 0.5 / 0.8) < 0.03
    temp = torch.bincount(sample_next(logp, 2.0, 1.0, draws()), minlength=4).float() / 4000
    expected = torch.softmax(logp[0] / 2.0, -1)
    assert (temp - expected).abs().max() < 0.03


def test_a_draw_takes_the_token_where_it_falls_in_the_cumulative_distribution():
    """Inverse transform sampling: token i for a draw u with F(i - 1) <= u < F(i), never a token of
    probability 0 (here token 1, cut by nothing but its own zero mass)."""
    logp = torch.tensor([0.25, 0.0, 0.5, 0.25]).log().repeat(6, 1)
    u = torch.tensor([0.0, 0.2499, 0.25, 0.7499, 0.75, 0.999999], dtype=torch.float64)
    assert sample_next(logp, 1.0, 1.0, u).tolist() == [0, 0, 2, 2, 3, 3]


def splitmix64(seed: int, index: int) -> float:
    """The reference splitmix64 in Python integers (mod 2^64 by hand): draw `index` of stream `seed`."""
    mask = (1 << 64) - 1
    z = (seed + (index + 1) * 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return ((z ^ (z >> 31)) >> 11) / 2 ** 53


def test_stream_uniforms_are_splitmix64_and_uniform():
    seeds = [0, 1, 2 ** 62 - 1, request_seed(7, 3, 1, 2)]
    for index in (0, 1, 159):
        assert stream_uniforms(np.array(seeds, dtype=np.uint64), index).tolist() == \
            [splitmix64(s, index) for s in seeds]
    u = stream_uniforms(np.array([request_seed(0, i) for i in range(20000)], dtype=np.uint64), 5)
    assert abs(u.mean() - 0.5) < 0.01 and u.min() >= 0 and u.max() < 1
    assert np.histogram(u, bins=10, range=(0, 1))[0].min() > 1800  # 2000 expected per tenth


def test_a_sample_does_not_depend_on_the_other_contexts_of_its_call(model, tokenizer, contexts):
    """Issue 47: sample j of a context is seeded by the context's place (`keys`) and j, so a context
    sampled alone, or beside other contexts in chunks of another size, gets the same tokens, and its
    log-probs to the rounding of batched logits."""
    together = TransformersEngine(model, tokenizer, batch_size=64).generate(
        contexts, 4, 16, seed=7, keys=[(10,), (11,), (12,)])
    for i, ctx in enumerate(contexts):
        alone = TransformersEngine(model, tokenizer, batch_size=4).generate([ctx], 4, 16, seed=7, keys=[(10 + i,)])[0]
        assert [c.token_ids for c in alone] == [c.token_ids for c in together[i]]
        for a, b in zip(alone, together[i]):
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    moved = TransformersEngine(model, tokenizer).generate(contexts, 4, 16, seed=7, keys=[(11,), (10,), (12,)])
    assert [c.token_ids for c in moved[0]] != [c.token_ids for c in together[0]]  # the place, not the position


def test_bad_arguments(model, tokenizer, contexts):
    engine = TransformersEngine(model, tokenizer)
    with pytest.raises(ValueError, match="n must be"):
        engine.generate(contexts, 0, 4)
    with pytest.raises(ValueError, match="entries for 3 contexts"):
        engine.generate(contexts, 1, [4, 4])
    with pytest.raises(ValueError, match="non-negative"):
        engine.generate(contexts, 1, -1)
    with pytest.raises(ValueError, match="top_p"):
        engine.generate(contexts, 1, 4, top_p=0.0)
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[]], 1, 4)


def test_make_engine_names(model, tokenizer):
    with pytest.raises(BfspoError, match="unknown engine"):
        make_engine("sglang", model, tokenizer)
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(BfspoError, match="needs vllm"):
            make_engine("vllm", None, tokenizer, model_path="unused")
