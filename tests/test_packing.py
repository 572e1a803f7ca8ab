"""Tree packing against per-chain runs of a tiny Qwen2 model (float32): log-probs, entropies, loss,
gradients; the vectorised packer against the previous one; micro-batches and split trees."""

import random

import numpy as np
import pytest
import torch

from bfspo.algorithm.advantages import assign_advantages, assign_rewards
from bfspo.algorithm.attention_options import bucket_lengths
from bfspo.algorithm.loss import policy_loss
from bfspo.algorithm.packing import pack_trees, packed_logprobs, pad_row, plan_micro_batches, row_buckets
from bfspo.algorithm.tree import SearchTree
from bfspo.errors import BfspoError
from tests.helpers.previous_packing import previous_pack_trees
from tests.helpers.trees import random_search_tree


@pytest.fixture
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")


def random_tree(seed, prompt_len, vocab):
    """Root with 3 chains; nested branching two levels deep (w^b1 with 3 children, w^b2 with 3)."""
    rng = random.Random(seed)
    t = SearchTree(prompt_ids=[rng.randrange(vocab) for _ in range(prompt_len)], budget=64)

    def add(parent, n, ok):
        s = t.add_completion(parent, [rng.randrange(vocab) for _ in range(n)], [0.0] * n,
                             [rng.random() for _ in range(n)], True, 0 if parent is None else 1)
        t.segments[s].leaf.correct = ok
        return s

    add(None, 5, False)
    b = add(None, 9, True)
    add(None, 3, False)
    wb1 = t.split(b, 2)
    t.segments[wb1].ends_in_B = True
    add(wb1, 4, False)
    c = add(wb1, 6, True)
    wb2 = t.split(c, 3)
    t.segments[wb2].ends_in_B = True
    add(wb2, 2, True)
    add(wb2, 5, False)
    return t


def chain_reference(model, tree):
    """Per token (segment, offset): [(log-prob, entropy after it)] from every chain holding it, run alone."""
    out = {}
    for leaf in tree.leaves():
        ids = tree.prompt_ids + tree.path_tokens(leaf)
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
        entropy = -(logp.exp() * logp).sum(-1)
        col = len(tree.prompt_ids)
        for s in tree.path(leaf):
            for j, tok in enumerate(tree.segments[s].token_ids):
                out.setdefault((s, j), []).append((logp[col - 1, tok].item(), entropy[col].item()))
                col += 1
    return out


def tokens_dfs(tree):
    return [(s, j) for s in tree.dfs() for j in range(len(tree.segments[s].token_ids))]


@pytest.mark.parametrize("attention,attn", [("blockwise", "sdpa"), ("dense", "sdpa"), ("dense", "eager")])
@pytest.mark.parametrize("layout", ["tree", "flat"])
def test_packed_logprobs_and_entropies_equal_per_chain_runs(model, attention, attn, layout):
    """Against the model's own attention on each chain alone; `dense` is the [T, T]-mask reference."""
    model.set_attn_implementation(attn)
    vocab = model.config.vocab_size
    trees = [random_tree(1, 7, vocab), random_tree(2, 3, vocab)]  # different prompt lengths, one row
    packed = pack_trees(trees, layout)
    with torch.no_grad():
        logprobs, entropies = packed_logprobs(model, packed, chunk_size=7, attention=attention)
    expected = []
    for t in trees:
        ref = chain_reference(model, t)
        for key in tokens_dfs(t):
            copies = ref[key]
            assert max(abs(lp - copies[0][0]) for lp, _ in copies) < 1e-5  # a shared token is one token
            expected.append(copies[0])
    expected = torch.tensor(expected)
    assert torch.allclose(logprobs, expected[:, 0], atol=1e-5, rtol=0)
    assert torch.allclose(entropies, expected[:, 1], atol=1e-5, rtol=0)


def test_tree_layout_computes_each_shared_token_once(model):
    vocab = model.config.vocab_size
    t = random_tree(3, 4, vocab)
    assign_rewards(t, overlong=False)
    assign_advantages(t, "branch")
    p = pack_trees([t], "tree")
    assert p.input_ids.shape == (1, 4 + t.n_tokens) and p.n_entries == t.n_tokens == p.n_unique_tokens
    assert p.positions.numel() == t.n_tokens + 1  # every tree token and the last prompt token, once
    # the packed row: depth-first tokens at positions prompt + depth, attending to their ancestors only
    seg0 = t.segments[t.dfs()[0]]
    assert p.position_ids[0, 4:4 + len(seg0.token_ids)].tolist() == list(range(4, 4 + len(seg0.token_ids)))
    assert p.dense_mask().sum(-1).tolist() == p.position_ids[0].add(1).tolist()  # ancestors + itself
    assert p.token_index.tolist() == list(range(t.n_tokens))
    assert p.old_logprobs.tolist() == [t.segments[s].logprobs[j] for s, j in tokens_dfs(t)]
    assert p.advantages.tolist() == pytest.approx([t.segments[s].advantage for s, _ in tokens_dfs(t)])
    assign_advantages(t, "global")
    g = pack_trees([t], "tree")
    assert g.n_entries == t.n_chain_tokens and g.positions.numel() == t.n_tokens + 1
    flat = pack_trees([t], "flat")
    assert flat.input_ids.shape[1] == t.n_chain_tokens + 4 * len(t.leaves()) and flat.n_entries == t.n_chain_tokens
    assert flat.positions.numel() > g.positions.numel()  # flat recomputes every shared prefix
    t2 = random_tree(4, 4, vocab)
    assert torch.isnan(pack_trees([t2]).advantages).all()  # no advantages assigned yet
    with pytest.raises(BfspoError, match="layout"):
        pack_trees([t], "packed")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(BfspoError, match="4-D mask"):
        packed_logprobs(model, p, attention="dense")
    with torch.no_grad():  # the tree kernels replace the model's attention, whatever it is
        assert torch.isfinite(packed_logprobs(model, p)[0]).all()
    assert model.config._attn_implementation == "flash_attention_2"  # and give it back


def test_output_head_runs_in_chunks(model):
    t = random_tree(5, 4, model.config.vocab_size)
    packed = pack_trees([t])
    seen = []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, i, o: seen.append(i[0].shape[0]))
    try:
        packed_logprobs(model, packed, chunk_size=6)[0].sum().backward()
    finally:
        hook.remove()
        model.zero_grad()
    n = packed.positions.numel()
    forward = seen[:len(range(0, n, 6))]
    assert max(seen) <= 6 and sum(forward) == n  # never a [tokens x vocab] block whole


def surrogate(lp, old, adv):
    ratio = torch.exp(lp - old)
    return torch.minimum(ratio * adv, torch.clamp(ratio, 0.8, 1.28) * adv)


def prepared_trees(model, kind, seeds=(11, 12)):
    """Trees whose old log-probs are the model's own plus noise (so some ratios clip), with advantages."""
    vocab = model.config.vocab_size
    trees = []
    gen = torch.Generator().manual_seed(0)
    for seed in seeds:
        t = random_tree(seed, 5, vocab)
        ref = chain_reference(model, t)
        for s, j in tokens_dfs(t):
            t.segments[s].logprobs[j] = ref[(s, j)][0][0] + float(torch.rand(1, generator=gen) - 0.5)
        assign_rewards(t, overlong=False)
        assign_advantages(t, kind)
        trees.append(t)
    return trees


def reference_loss(model, trees, kind):
    """Eq. 10 (branch: over unique tokens) or Eq. 2 (global: over flattened chains), one chain at a time."""
    terms = {}
    for ti, t in enumerate(trees):
        for leaf in t.leaves():
            ids = t.prompt_ids + t.path_tokens(leaf)
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
            col = len(t.prompt_ids)
            for s in t.path(leaf):
                seg = t.segments[s]
                for j, tok in enumerate(seg.token_ids):
                    key = (ti, s, j) if kind == "branch" else (ti, leaf, s, j)
                    adv = seg.advantage if kind == "branch" else t.segments[leaf].leaf.advantage
                    terms.setdefault(key, surrogate(logp[col - 1, tok], torch.tensor(seg.logprobs[j]), adv))
                    col += 1
    return -torch.stack(list(terms.values())).sum() / len(terms), len(terms)


def grads(model, loss):
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.autograd.grad(loss, params)


@pytest.mark.parametrize("kind,layout", [("branch", "tree"), ("global", "tree"),
                                         ("global", "flat"), ("branch", "flat")])
def test_packed_loss_and_gradients_equal_the_equations(model, kind, layout):
    trees = prepared_trees(model, kind)
    ref, n_terms = reference_loss(model, trees, kind)
    packed = pack_trees(trees, layout)
    logprobs, _ = packed_logprobs(model, packed, chunk_size=16)
    loss, stats = policy_loss(logprobs, packed.old_logprobs, packed.advantages)
    assert stats["n_tokens"] == n_terms == sum(t.n_tokens if kind == "branch" else t.n_chain_tokens for t in trees)
    assert 0 < stats["clip_frac"] < 1
    assert loss.item() == pytest.approx(ref.item(), abs=1e-6)
    for g, g_ref in zip(grads(model, loss), grads(model, ref)):
        assert torch.allclose(g, g_ref, atol=1e-6, rtol=1e-4)


def test_k0_tree_loss_equals_flat_dapo(model):
    """K = 0: the tree is DAPO's group; branch advantages are Eq. 1; Eq. 10 equals Eq. 2 over the chains."""
    vocab = model.config.vocab_size
    rng = random.Random(7)
    t = SearchTree(prompt_ids=[rng.randrange(vocab) for _ in range(6)], budget=32)
    for n, ok in [(4, True), (9, False), (6, True), (12, False)]:
        s = t.add_completion(None, [rng.randrange(vocab) for _ in range(n)], [0.0] * n, [0.5] * n, True, 0)
        t.segments[s].leaf.correct = ok
    ref = chain_reference(model, t)
    for s, j in tokens_dfs(t):
        t.segments[s].logprobs[j] = ref[(s, j)][0][0] + 0.3 * (-1) ** j
    assign_rewards(t, overlong=True)
    assign_advantages(t, "branch")
    packed = pack_trees([t], "tree")
    loss, _ = policy_loss(packed_logprobs(model, packed)[0], packed.old_logprobs, packed.advantages)
    # DAPO from scratch: sequences side by side, the group advantage of Eq. 1 on their rewards
    rewards = torch.tensor([t.segments[i].leaf.reward for i in t.leaves()])
    adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
    terms = []
    for a, leaf in zip(adv, t.leaves()):
        ids = t.prompt_ids + t.path_tokens(leaf)
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0], -1)
        old = torch.tensor(t.segments[leaf].logprobs)
        P = len(t.prompt_ids)
        lp = logp[torch.arange(P - 1, len(ids) - 1), torch.tensor(ids[P:])]
        terms.append(surrogate(lp, old, a))
    dapo = -torch.cat(terms).sum() / sum(len(x) for x in terms)
    assert loss.item() == pytest.approx(dapo.item(), abs=1e-6)
    for g, g_ref in zip(grads(model, loss), grads(model, dapo)):
        assert torch.allclose(g, g_ref, atol=1e-6, rtol=1e-4)


def test_trees_sampled_by_the_engine_pack_back_to_their_own_logprobs_and_entropies(model, tiny_model_dir):
    """End to end with the real sampler: on-policy, the packed log-probs are the engine's pi_old, and
    the packed entropy after each token is the tree's entropy_after (the engine's next step entropy)."""
    from transformers import AutoTokenizer

    from bfspo.algorithm.search import build_trees
    from bfspo.rollout.hf_engine import TransformersEngine

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [tok("Tom has 3 apples.")["input_ids"], tok("A shop sells 12 pens")["input_ids"]]
    scorers = [lambda ids: sum(ids) % 2 == 0] * 2
    trees = build_trees(TransformersEngine(model, tok), prompts, scorers, group_size=3, k=2, budget=10, seed=0)
    assert sum(len(t.backtracking) for t in trees) >= 1
    packed = pack_trees(trees)
    with torch.no_grad():
        logprobs, entropies = packed_logprobs(model, packed)
    assert torch.allclose(logprobs, packed.old_logprobs, atol=1e-4, rtol=0)
    after = torch.tensor([h for t in trees for s in t.dfs() for h in t.segments[s].entropy_after])
    known = ~after.isnan()
    assert known.sum() > 0 and torch.allclose(entropies[known], after[known], atol=1e-4, rtol=0)


# --- the vectorised packer against the previous one ---------------------------------------------


@pytest.mark.parametrize("layout", ["tree", "flat"])
def test_vectorised_packer_equals_the_previous_packer(layout):
    """Same rows (the previous padded rows side by side in one unpadded row), positions, masks and
    entries, on random trees of every advantage kind, K = 0 to 3."""
    for seed in range(24):
        kind = ("branch", "global", None)[seed % 3]
        trees = [random_search_tree(seed * 10 + i, prompt_len=1 + (seed + i) % 5, vocab=50, group=1 + seed % 4,
                                    k=seed % 4, advantage=kind) for i in range(3)]
        old, new = previous_pack_trees(trees, layout), pack_trees(trees, layout)
        starts = np.cumsum([0] + old.lengths[:-1])
        assert new.input_ids.shape == (1, sum(old.lengths))
        dense = new.dense_mask()
        for r, (a, n) in enumerate(zip(starts, old.lengths)):
            assert torch.equal(new.input_ids[0, a:a + n], old.input_ids[r, :n])
            assert torch.equal(new.position_ids[0, a:a + n], old.position_ids[r, :n])
            assert torch.equal(dense[a:a + n, a:a + n], old.allowed[r, :n, :n])
            assert not dense[a:a + n, :a].any() and not dense[a:a + n, a + n:].any()  # rows never see each other
        width = old.input_ids.shape[1]
        assert new.positions.tolist() == [starts[x // width] + x % width for x in old.positions.tolist()]
        for name in ("parent", "own", "targets", "tree_index", "old_logprobs"):
            assert torch.equal(getattr(new, name), getattr(old, name)), name
        assert torch.equal(new.advantages.isnan(), old.advantages.isnan())
        assert torch.equal(new.advantages.nan_to_num(), old.advantages.nan_to_num())
        assert new.n_unique_tokens == old.n_unique_tokens and new.layout == layout


# --- tree attention and micro-batches -----------------------------------------------------------


def entry_values(packed, logprobs, entropies):
    """(tree, token index, entry number) -> (log-prob, entropy) of each entry."""
    return {(t, x, e): (lp, h) for e, (t, x, lp, h) in enumerate(zip(
        packed.tree_index.tolist(), packed.token_index.tolist(), logprobs.tolist(), entropies.tolist()))}


@pytest.mark.parametrize("k", [0, 3])
def test_tree_attention_equals_the_dense_reference_on_random_trees(model, k):
    vocab = model.config.vocab_size
    for kind in ("branch", "global"):
        trees = [random_search_tree(100 * k + i, prompt_len=2 + i, vocab=vocab, group=6, k=k, max_len=40,
                                    advantage=kind) for i in range(3)]
        packed = pack_trees(trees)
        with torch.no_grad():
            tree = packed_logprobs(model, packed)
            dense = packed_logprobs(model, packed, attention="dense")
        assert packed.input_ids.shape[1] > 256  # more than one query block of the CPU kernel
        for a, b in zip(tree, dense):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_split_trees_give_the_same_logprobs_and_entropies(model):
    """Micro-batches of whole trees, and trees cut into pieces that carry their ancestors: every
    entry appears once and keeps its log-prob and entropy."""
    vocab = model.config.vocab_size
    for kind in ("branch", "global"):
        trees = [random_search_tree(7 + i, prompt_len=3 + i, vocab=vocab, group=4, k=3, max_len=15, advantage=kind)
                 for i in range(3)]
        whole = pack_trees(trees)
        with torch.no_grad():
            reference = entry_values(whole, *packed_logprobs(model, whole))
        longest = max(len(t.prompt_ids) + t.n_tokens for t in trees)
        for budget in (sum(len(t.prompt_ids) + t.n_tokens for t in trees), longest, longest - 1, 70, 48):
            batches = plan_micro_batches(trees, budget)
            values, counts = {}, {}
            for pieces in batches:
                packed = pack_trees(trees, pieces=pieces)
                assert packed.input_ids.shape[1] == sum(p.tokens for p in pieces) <= budget
                with torch.no_grad():
                    lp, ent = packed_logprobs(model, packed)
                for (t, x, _), v in entry_values(packed, lp, ent).items():
                    values.setdefault((t, x), []).append(v)
            for (t, x, _), (lp, h) in reference.items():
                got = values[(t, x)]
                counts[(t, x)] = counts.get((t, x), 0) + 1
                assert all(abs(g[0] - lp) < 1e-5 and abs(g[1] - h) < 1e-5 for g in got)
            assert all(len(values[key]) == n for key, n in counts.items())  # each entry exactly once
            assert any(p.lo > 0 for b in batches for p in b) == (budget < longest)  # only a tree too long is cut


def test_micro_batch_plan_keeps_whole_trees_and_refuses_a_budget_below_one_chain():
    trees = [random_search_tree(i, prompt_len=5, vocab=50, group=3, k=2) for i in range(4)]
    sizes = [5 + t.n_tokens for t in trees]
    plan = plan_micro_batches(trees, max(sizes))
    assert sorted(p.tree for b in plan for p in b) == [0, 1, 2, 3]
    assert all(p.lo == 0 and p.hi == trees[p.tree].n_tokens and p.tokens == sizes[p.tree] for b in plan for p in b)
    assert all(sum(p.tokens for p in b) <= max(sizes) for b in plan)
    assert [[p.tree for p in b] for b in plan_micro_batches(trees, sum(sizes))] == [[0, 1, 2, 3]]
    deepest = max(int(d) for t in trees for d in [t.segments[i].leaf.length for i in t.leaves()])
    with pytest.raises(BfspoError, match="micro_batch_tokens"):
        plan_micro_batches(trees, 5 + deepest - 1)


# --- rows padded to bucket lengths (the compiled flex kernel) --------------------------------------


@pytest.mark.parametrize("attention", ["blockwise", "dense"])
def test_padding_a_row_to_a_bucket_changes_no_logprob_entropy_or_gradient(model, attention):
    """Padding sees only itself and no token sees it: the entries' log-probs, entropies and the
    gradient of a loss on them are those of the unpadded row (the padding spans whole query blocks
    of the blockwise kernel, and shares one with the row's last tokens). In float64, where only
    the summation order of the weights' gradients over more rows differs."""
    model = model.double()
    vocab = model.config.vocab_size
    trees = [random_search_tree(40 + i, prompt_len=3 + i, vocab=vocab, group=4, k=3, max_len=20) for i in range(2)]
    packed = pack_trees(trees)
    t = packed.n_row_tokens
    padded = pad_row(packed, t + 300)
    assert padded.n_row_tokens == t + 300 and int(packed.ends.max()) == t  # no real interval reaches the padding
    assert torch.equal(padded.ends, torch.cat([packed.ends, torch.arange(t + 1, t + 301)]))
    assert torch.equal(padded.positions, packed.positions) and padded.n_entries == packed.n_entries
    weights = torch.randn(packed.n_entries, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    results = []
    for buckets in ((), (t - 1, t + 300, t + 600)):
        model.zero_grad()
        logprobs, entropies = packed_logprobs(model, packed, attention=attention, buckets=buckets)
        (logprobs * weights).sum().backward()
        results.append((logprobs.detach(), entropies, [p.grad.clone() for p in model.parameters()]))
    (lp, ent, grads), (lp_pad, ent_pad, grads_pad) = results
    torch.testing.assert_close(lp_pad, lp, atol=1e-12, rtol=0)
    torch.testing.assert_close(ent_pad, ent, atol=1e-12, rtol=0)
    for a, b in zip(grads_pad, grads):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_flex_rows_are_padded_to_buckets_and_compiled_once_per_bucket(model, monkeypatch):
    """Micro-batches of seven lengths run flex (uncompilable backward aside, as on CUDA: no_grad, as the
    rescoring) at two bucket lengths: two compiles, and the blockwise kernel's log-probs. aot_eager
    stands in for Inductor: the same Dynamo guards and graphs, no code generation."""
    from torch._dynamo.utils import counters

    from bfspo.algorithm import tree_attention

    monkeypatch.setattr(tree_attention, "FLEX_BACKEND", "aot_eager")
    monkeypatch.setattr(tree_attention, "_compiled_flex", None)
    vocab = model.config.vocab_size
    trees = [random_search_tree(60 + i, prompt_len=2 + i, vocab=vocab, group=3, k=i % 3, max_len=30) for i in range(7)]
    buckets = row_buckets("flex", torch.device("cpu"), 768, 384)
    assert buckets == bucket_lengths(768, 384) == (384, 768)
    assert row_buckets("blockwise", torch.device("cpu"), 768, 384) == ()
    assert row_buckets("auto", torch.device("cpu"), 768, 384) == ()  # auto is blockwise on CPU
    torch._dynamo.reset()
    counters.clear()
    lengths = set()
    with torch.no_grad():
        for n in range(1, 8):
            packed = pack_trees(trees[:n])
            lengths.add(packed.n_row_tokens)
            flex = packed_logprobs(model, packed, attention="flex", buckets=buckets)
            blockwise = packed_logprobs(model, packed, attention="blockwise")
            for a, b in zip(flex, blockwise):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert len(lengths) == 7 and min(lengths) <= 384 < max(lengths) <= 768
    assert counters["stats"]["unique_graphs"] == 2
    torch._dynamo.reset()


def test_the_linear_head_chunk_has_the_gradients_of_plain_autograd():
    """`_LinearHeadChunk` (logits recomputed once in the backward pass) against autograd through the
    whole [chunk, V] logits, with a bias and a target repeated across rows. The logits are float32
    (`_head_chunk` upcasts them), and the repeated target's two gradients may add in another order:
    float32 rounding."""
    from bfspo.algorithm.packing import _head_chunk, _head_chunk_with_grad

    gen = torch.Generator().manual_seed(0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        head = torch.nn.Linear(6, 11, dtype=torch.float64)
    hidden = torch.randn(5, 6, dtype=torch.float64, generator=gen).requires_grad_()
    rows, targets = torch.tensor([0, 0, 2, 4, 4]), torch.tensor([3, 3, 1, 10, 0])
    weights = torch.randn(2, 5, dtype=torch.float64, generator=gen)
    results = []
    for fn in (_head_chunk, _head_chunk_with_grad):
        lse, entropy, target = fn(head, hidden, rows, targets)
        loss = (weights[0] * lse).sum() + (weights[1] * target).sum()
        results.append((lse, entropy, target, *torch.autograd.grad(loss, (hidden, head.weight, head.bias))))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-6)
