"""Rewards (Eq. 4, Eq. 8), branch advantage (Eq. 9, Algorithm 2), global advantage (Eq. 1), filter."""

import math

import pytest
import torch

from bfspo.algorithm.advantages import (
    EPS,
    FILTERS,
    assign_advantages,
    assign_rewards,
    first_samples,
    group_advantages,
    keep_tree,
)
from bfspo.algorithm.tree import SearchTree
from bfspo.errors import BfspoError

SQ2 = math.sqrt(2)


def add(t, parent, n, correct, finished=True):
    s = t.add_completion(parent, list(range(10, 10 + n)), [-0.5] * n, [1.0] * n, finished, 0 if parent is None else 1)
    t.segments[s].leaf.correct = correct
    return s


def two_level_tree(budget=100):
    """root -> {a: 3 wrong tokens, b: 6 tokens, split after token 2 (w^b1)}
    w^b1 -> {rest of b: correct, c2: wrong, c3: 4 tokens, split after token 1 (w^b2)}
    w^b2 -> {rest of c3: correct, d2: wrong}.  Leaf lengths: a 3, b 6, c2 5, c3 7, d2 6."""
    t = SearchTree(prompt_ids=[1, 2], budget=budget)
    a = add(t, None, 3, False)
    b = add(t, None, 6, True)
    wb1 = t.split(b, 1)
    t.segments[wb1].ends_in_B = True
    c2 = add(t, wb1, 3, False)
    c3 = add(t, wb1, 5, True)
    wb2 = t.split(c3, 1)
    t.segments[wb2].ends_in_B = True
    d2 = add(t, wb2, 2, False)
    return t, dict(a=a, b=b, wb1=wb1, c2=c2, c3=c3, wb2=wb2, d2=d2)


def test_group_advantages_eq1_unbiased_std_and_eps():
    r = [1.0, -1.0, -1.0, 1.0]
    expected = ((torch.tensor(r) - torch.tensor(r).mean()) / (torch.tensor(r).std() + EPS)).tolist()
    assert group_advantages(r) == pytest.approx(expected, abs=1e-7)
    assert group_advantages(r)[0] == pytest.approx(1 / math.sqrt(4 / 3), rel=1e-5)
    assert group_advantages([0.7, 0.7, 0.7]) == [0.0, 0.0, 0.0]  # sigma = 0 -> 0
    assert group_advantages([0.5]) == [0.0]


def test_rewards_and_branch_advantages_by_hand():
    t, n = two_level_tree()
    assign_rewards(t, overlong=False)
    seg = t.segments
    # Eq. 4 (+-1) at the leaves, Eq. 8 upwards: R(w^b2) = (1 - 1)/2 = 0; R(w^b1) = (1 - 1 + 0)/3 = 0;
    # R(root) = (-1 + 0)/2 = -0.5. The tokens of a segment share the reward of its last token.
    assert [seg[n[k]].reward for k in ("a", "b", "c2", "c3", "d2", "wb1", "wb2")] == [-1, 1, -1, 1, -1, 0, 0]
    assert t.root_reward == -0.5
    assign_advantages(t, "branch")
    adv = {k: seg[n[k]].advantage for k in n}
    # root: children (-1, 0), sigma = 1/sqrt 2 -> -+ 0.5 * sqrt 2
    assert adv["a"] == pytest.approx(-1 / SQ2, rel=1e-5) and adv["wb1"] == pytest.approx(1 / SQ2, rel=1e-5)
    # w^b1: children (1, -1, 0) with mean 0 = R(w^b1), sigma = 1 -> 1, -1, 0 (the branch to w^b2 is S(w^b1)'s 3rd)
    assert [adv["b"], adv["c2"], adv["wb2"]] == pytest.approx([1, -1, 0], abs=1e-5)
    # nested w^b2: children (1, -1), sigma = sqrt 2 -> +- 1/sqrt 2
    assert [adv["c3"], adv["d2"]] == pytest.approx([1 / SQ2, -1 / SQ2], rel=1e-5)


def test_overlong_reward_uses_the_tree_budget():
    # budget 10: L_cache = 2, L_max = 8; R_l = 0 up to 6 tokens, (6 - |o|)/2 up to 8, -1 beyond
    t, n = two_level_tree(budget=10)
    assign_rewards(t, overlong=True)
    leaf = {k: t.segments[n[k]].leaf.reward for k in ("a", "b", "c2", "c3", "d2")}
    assert leaf == pytest.approx({"a": -1.0, "b": 1.0, "c2": -1.0, "c3": 1.0 - 0.5, "d2": -1.0})
    assert t.segments[n["wb2"]].reward == pytest.approx((0.5 - 1.0) / 2)


def token_level_reference(t):
    """Eq. 8 and Eq. 9 on the paper's token tree, with S(b) built by Algorithm 2, from scratch."""
    def children(node):
        if node is None:
            return [(c, 0) for c in t.root_children]
        s, j = node
        seg = t.segments[s]
        return [(s, j + 1)] if j + 1 < len(seg.token_ids) else [(c, 0) for c in seg.children]

    reward = {}

    def r(node):
        if node not in reward:
            kids = children(node)
            reward[node] = t.segments[node[0]].leaf.reward if not kids else sum(map(r, kids)) / len(kids)
        return reward[node]

    r(None)
    nodes = [(s.id, j) for s in t.segments for j in range(len(s.token_ids))]
    advantage = {}
    for b in [None] + [x for x in nodes if len(children(x)) > 1]:
        kids = children(b)
        rs = torch.tensor([reward[c] for c in kids], dtype=torch.float64)
        sigma = float(rs.std())
        for child in kids:  # Algorithm 2: walk down to the next leaf or branching node, inclusive
            w = child
            while True:
                advantage[w] = 0.0 if sigma == 0 else (reward[w] - reward[b]) / (sigma + EPS)
                nxt = children(w)
                if len(nxt) != 1:
                    break
                w = nxt[0]
    return reward, advantage, nodes


@pytest.mark.parametrize("overlong", [False, True])
def test_segment_advantages_equal_the_token_level_equations(overlong):
    t, _ = two_level_tree(budget=10)
    assign_rewards(t, overlong=overlong)
    assign_advantages(t, "branch")
    reward, advantage, nodes = token_level_reference(t)
    assert set(advantage) == set(nodes)  # every token lies in exactly one S(b)
    for s, j in nodes:
        assert t.segments[s].reward == pytest.approx(reward[(s, j)], abs=1e-12)
        assert t.segments[s].advantage == pytest.approx(advantage[(s, j)], abs=1e-9)


def test_global_advantage_is_eq1_over_the_chains():
    t, n = two_level_tree()
    assign_rewards(t, overlong=False)
    assign_advantages(t, "global")
    leaves = t.leaves()
    rewards = [t.segments[i].leaf.reward for i in leaves]
    assert [t.segments[i].leaf.advantage for i in leaves] == pytest.approx(group_advantages(rewards))
    assert all(s.advantage is None for s in t.segments) and t.advantage_kind == "global"
    # switching back clears the per-chain values
    assign_advantages(t, "branch")
    assert all(t.segments[i].leaf.advantage is None for i in leaves) and t.segments[n["a"]].advantage is not None


def test_k0_branch_advantage_is_the_dapo_group_advantage():
    t = SearchTree(prompt_ids=[1], budget=50)
    for n, ok in [(4, False), (7, True), (5, True), (35, True)]:
        add(t, None, n, ok)
    assign_rewards(t, overlong=True)
    rewards = [t.segments[i].leaf.reward for i in t.leaves()]
    assert rewards == pytest.approx([-1.0, 1.0, 1.0, 1 + (30 - 35) / 10])  # L_max - L_cache = 30, L_cache = 10
    assign_advantages(t, "branch")
    assert [t.segments[i].advantage for i in t.leaves()] == pytest.approx(group_advantages(rewards))


def test_filter_keeps_trees_with_some_but_not_all_correct():
    t, n = two_level_tree()
    assert keep_tree(t)
    for i in t.leaves():
        t.segments[i].leaf.correct = True
    assert not keep_tree(t)
    for i in t.leaves():
        t.segments[i].leaf.correct = False
    assert not keep_tree(t)


def first_group_tree(first, expansion, expand=0):
    """G first answers (correct flags `first`, 5 tokens each; G = len(first)); first answer `expand`
    split after its first token (w^b) with one expansion of G answers (flags `expansion`, 3 tokens)."""
    t = SearchTree(prompt_ids=[1, 2], budget=100)
    ids = [add(t, None, 5, ok) for ok in first]
    if expansion:
        wb = t.split(ids[expand], 0)
        t.segments[wb].ends_in_B = True
        ids += [add(t, wb, 2, ok) for ok in expansion]
        return t, ids, wb
    return t, ids, None


@pytest.mark.parametrize("first, expansion, all_leaves, first_samples_", [
    ([True, False, True, True], [False] * 4, True, True),  # mixed first group: both keep
    ([True] * 4, [True, False, True, True], True, False),  # all-correct first group, a failed expansion
    ([False] * 4, [True, False, False, False], True, False),  # all-wrong first group rescued (w/o BFS)
    ([True] * 4, [True] * 4, False, False),  # every leaf correct: no signal either way
    ([False] * 4, [], False, False),  # all wrong, never expanded
    ([True, False, False, False], [], True, True),  # K = 0: both are DAPO's constraint
])
def test_both_filter_readings_on_hand_built_trees(first, expansion, all_leaves, first_samples_):
    t, ids, _ = first_group_tree(first, expansion)
    assert first_samples(t) == ids[:len(first)]
    assert keep_tree(t) is keep_tree(t, "all_leaves") is all_leaves
    assert keep_tree(t, "first_samples") is first_samples_


def test_the_two_readings_agree_at_k0_on_every_group():
    for pattern in range(2 ** 3):
        t, _, _ = first_group_tree([bool(pattern >> i & 1) for i in range(3)], [])
        assert keep_tree(t, "all_leaves") is keep_tree(t, "first_samples") is (0 < pattern < 7)
        assert keep_tree(t, "none"), "no filter keeps every group, signal or not (TRL's GRPOTrainer)"
    with pytest.raises(BfspoError, match="unknown filter 'leaves'"):
        keep_tree(t, "leaves")
    assert FILTERS == ("all_leaves", "first_samples", "none")


@pytest.mark.parametrize("expansion", [[False] * 8, [True, False, False, False, False, False, False, False],
                                       [True] * 7 + [False]])
def test_all_correct_first_group_kept_by_all_leaves_pushes_the_best_prefix_down(expansion):
    """Issue 25: G = 8 first answers all correct (reward 1), the first one expanded with G = 8
    answers of which some fail. Its prefix w^b is worth r = mean of its 9 children < 1 (Eq. 8); its
    7 siblings are worth 1. Eq. 1 on the root's children (7 x 1, r): mean (7 + r) / 8, deviation of
    w^b (7/8)(r - 1), unbiased std (1 - r) / sqrt 8, so A(w^b) = -7 / sqrt 8 = -2.47 whatever r
    is, and each sibling gets +1 / sqrt 8. DAPO drops this group; 'first_samples' drops the tree."""
    t, ids, wb = first_group_tree([True] * 8, expansion)
    assign_rewards(t, overlong=False)
    assign_advantages(t, "branch")
    assert keep_tree(t, "all_leaves") and not keep_tree(t, "first_samples")
    r = (1 + sum(1 if ok else -1 for ok in expansion)) / 9
    assert t.segments[wb].reward == pytest.approx(r)
    assert t.segments[wb].advantage == pytest.approx(-7 / math.sqrt(8), rel=1e-4)  # eps in the std
    assert [t.segments[i].advantage for i in ids[1:8]] == pytest.approx([1 / math.sqrt(8)] * 7, rel=1e-4)


def test_advantages_need_rewards_and_a_known_kind():
    t, _ = two_level_tree()
    with pytest.raises(ValueError):
        assign_advantages(t, "branch")
    assign_rewards(t)
    with pytest.raises(BfspoError, match="advantage"):
        assign_advantages(t, "local")


def test_overlong_reward_in_dapos_window():
    # budget 10, DAPO's window: L_cache = 2, L_max = 10; R_l = 0 up to 8 tokens, so c3 (7 tokens,
    # -0.5 in the paper's window) is not punished
    t, n = two_level_tree(budget=10)
    assign_rewards(t, overlong=True, window="dapo")
    leaf = {k: t.segments[n[k]].leaf.reward for k in ("a", "b", "c2", "c3", "d2")}
    assert leaf == pytest.approx({"a": -1.0, "b": 1.0, "c2": -1.0, "c3": 1.0, "d2": -1.0})
    assert t.segments[n["wb2"]].reward == pytest.approx(0.0)
