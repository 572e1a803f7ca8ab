"""The segment-stored search tree: entropy shift, splitting with stable identities, serialisation."""

import json
import math

import pytest

from bfspo.algorithm.tree import SearchTree, best_leaf


def small_tree():
    """Root with two chains; the first one is split after its 2nd token and gets one more child."""
    t = SearchTree(prompt_ids=[90, 91], budget=10)
    t.add_completion(None, [1, 2, 3, 4], [-0.1, -0.2, -0.3, -0.4], [0.5, 1.5, 2.5, 3.5], True, 0)
    t.add_completion(None, [5, 6], [-0.5, -0.6], [0.1, 0.2], False, 0)
    b = t.split(0, 1)
    t.segments[b].ends_in_B = True
    t.add_completion(b, [7, 8, 9], [-0.7, -0.8, -0.9], [4.0, 5.0, 6.0], True, 1)
    return t, b


def test_completion_entropies_are_shifted_to_the_entropy_after_each_token():
    t = SearchTree(prompt_ids=[1], budget=8)
    s = t.add_completion(None, [10, 11, 12], [-1.0, -2.0, -3.0], [0.7, 0.8, 0.9], True, 0)
    seg = t.segments[s]
    # step entropy t+1 is the entropy of the distribution after token t; nothing after the last token
    assert seg.entropy_after[:2] == [0.8, 0.9] and math.isnan(seg.entropy_after[2])
    assert (seg.start, seg.end, seg.leaf.length, seg.leaf.finished) == (1, 3, 3, True)


def test_split_keeps_leaf_identity_and_token_order():
    t, b = small_tree()
    tokens_before = [tok for s in t.dfs() for tok in t.segments[s].token_ids]
    assert b == 2  # the upper part is a new segment
    upper, lower = t.segments[b], t.segments[0]
    assert upper.token_ids == [1, 2] and upper.ends_in_B and upper.parent is None
    assert lower.token_ids == [3, 4] and lower.parent == b and lower.start == 3 and lower.leaf.length == 4
    assert upper.entropy_after == [1.5, 2.5] and lower.logprobs == [-0.3, -0.4]
    assert t.root_children == [b, 1] and upper.children == [0, 3]
    assert t.leaves() == [0, 1, 3]  # leaves keep their ids, in creation order
    assert t.path_tokens(0) == [1, 2, 3, 4] and t.path_tokens(3) == [1, 2, 7, 8, 9]
    assert t.path_tokens(0, upto=0) == [1, 2, 3]
    assert t.segments[3].start == 3 and t.segments[3].leaf.length == 5
    assert tokens_before == [1, 2, 3, 4, 7, 8, 9, 5, 6]
    assert (t.n_tokens, t.n_chain_tokens) == (9, 4 + 2 + 5)


def test_splitting_above_a_backtracking_token_leaves_its_flag_on_the_lower_part():
    t, b = small_tree()
    b2 = t.split(b, 0)
    assert t.segments[b2].token_ids == [1] and not t.segments[b2].ends_in_B
    assert t.segments[b].token_ids == [2] and t.segments[b].ends_in_B and t.segments[b].children == [0, 3]
    assert t.path_tokens(3) == [1, 2, 7, 8, 9]


def test_split_and_add_reject_impossible_requests():
    t, b = small_tree()
    with pytest.raises(ValueError):
        t.split(b, 1)  # the last token of a segment already ends it
    with pytest.raises(ValueError):
        t.add_completion(0, list(range(7)), [0.0] * 7, [0.0] * 7, False, 2)  # depth 5..11 > budget 10
    with pytest.raises(ValueError):
        t.add_completion(None, [], [], [], True, 0)


def test_best_leaf_is_the_shortest_correct_path_earliest_on_ties():
    t, _ = small_tree()
    assert best_leaf(t) is None
    for i in (0, 3):
        t.segments[i].leaf.correct = True
    assert best_leaf(t) == 0  # length 4 beats 5
    t.segments[1].leaf.correct = True
    assert best_leaf(t) == 1  # length 2
    t2 = SearchTree(prompt_ids=[1], budget=5)
    for _ in range(3):
        t2.add_completion(None, [4, 5], [0.0, 0.0], [1.0, 1.0], True, 0)
    for i in (1, 2):
        t2.segments[i].leaf.correct = True
    assert best_leaf(t2) == 1


def test_to_dict_is_strict_json_and_round_trips():
    t, b = small_tree()
    t.segments[0].leaf.correct = True
    t.backtracking.append({"iteration": 1, "depth": 2, "path_length": 4, "entropy": 2.5, "leaf": 0, "segment": b})
    t.selected.append({"iteration": 1, "leaf": 0, "length": 4})
    t.meta["question"] = "q1"
    d = t.to_dict(decode=lambda ids: [f"w{i}" for i in ids])
    text = json.dumps(d, allow_nan=False)  # NaN entropies become null
    d2 = json.loads(text)
    assert d2["segments"][0]["entropy_after"][-1] is None and d2["segments"][b]["text"] == ["w1", "w2"]
    assert d2["best"] == {"leaf": 0, "length": 4}
    assert (d2["n_tokens"], d2["n_chain_tokens"]) == (9, 11)
    t2 = SearchTree.from_dict(d2)
    assert t2.to_dict() == t.to_dict()
    assert math.isnan(t2.segments[0].entropy_after[-1])
