"""The vLLM engine against the transformers engine. Runs only where vLLM and a CUDA GPU exist;
it has not run in this repository's CI (no GPU there)."""

from __future__ import annotations

import importlib.util
import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.gpu,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None or not torch.cuda.is_available(),
                       reason="needs vllm and a CUDA GPU"),
]

TEXTS = ["Tom has 3 apples.", "A shop sells 12 pens a day for 5 days. 12 * 5 = 60. So the answer is"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A float32 tiny model with attention heads vLLM's kernels support (head_dim 64), a LoRA
    policy on it, and one vLLM engine for the module (vLLM holds the GPU per process)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from bfspo.rollout import make_engine
    from bfspo.toy.model import new_model, save_model_dir, train_tokenizer
    from conftest import TINY_CORPUS

    tokenizer = train_tokenizer(TINY_CORPUS, vocab_size=320)
    model = new_model(tokenizer, hidden_size=128, layers=2, heads=2, kv_heads=1, seed=0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3, generator=gen)
    model_dir = save_model_dir(model, tokenizer, tmp_path_factory.mktemp("vllm_model"))
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).cuda()
    policy = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                             init_lora_weights=False)).eval()
    engine = make_engine("vllm", policy, tokenizer, dtype="float32", gpu_memory_utilization=0.3,
                         work_dir=str(tmp_path_factory.mktemp("vllm_lora")))
    contexts = [tokenizer(t)["input_ids"] for t in TEXTS]
    return engine, policy, tokenizer, contexts


def transformers_greedy(policy, tokenizer, contexts, budget):
    from bfspo.rollout.hf_engine import TransformersEngine

    return TransformersEngine(policy, tokenizer).generate(contexts, 1, budget, temperature=0)


def test_greedy_matches_the_transformers_engine(setup):
    engine, policy, tokenizer, contexts = setup
    ours = engine.generate(contexts, 2, 8, temperature=0)
    ref = transformers_greedy(policy, tokenizer, contexts, 8)
    for completions, (expected,) in zip(ours, ref):
        for c in completions:
            assert c.token_ids == expected.token_ids
            assert all(math.isnan(h) for h in c.entropies)  # computed on the training side
            torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(expected.logprobs), atol=1e-3, rtol=0)


def test_budgets_seed_and_n(setup):
    engine, _, _, contexts = setup
    a = engine.generate(contexts, 4, [0, 6], seed=5)
    assert all(c.token_ids == [] for c in a[0])
    assert all(len(c.token_ids) == 6 or c.finished for c in a[1])
    assert [[c.token_ids for c in r] for r in engine.generate(contexts, 4, [0, 6], seed=5)] == \
        [[c.token_ids for c in r] for r in a]


def test_sync_weights_pushes_the_new_adapter(setup):
    engine, policy, tokenizer, contexts = setup
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.mul_(-3.0)
    engine.sync_weights(policy)
    assert len(list(engine.work_dir.iterdir())) == 1  # the previous adapter directory is gone
    ours = engine.generate(contexts, 1, 8, temperature=0)
    ref = transformers_greedy(policy, tokenizer, contexts, 8)
    assert [r[0].token_ids for r in ours] == [r[0].token_ids for r in ref]
