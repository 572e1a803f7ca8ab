"""Algorithm 1 with a scripted sampler: Figure 1 step by step, the no_bfs variant, the edge cases."""

import pytest

from bfspo.algorithm.advantages import keep_tree
from bfspo.algorithm.search import backtracking_point, build_trees
from bfspo.algorithm.tree import SearchTree, best_leaf
from bfspo.errors import BfspoError
from bfspo.rollout.base import Completion

EOS, ANSWER = 1, 7  # a path is correct iff it contains the right answer token


def correct(ids):
    return ANSWER in ids


def comp(tokens, step_entropies=None, finished=True):
    """A completion with the given step entropies (entropy of the distribution each token came from)."""
    n = len(tokens)
    return Completion(token_ids=list(tokens), logprobs=[-0.01 * (i + 1) for i in range(n)],
                      entropies=list(step_entropies or [0.1] * n), finished=finished)


class ScriptedEngine:
    """Returns the continuations scripted for each context (prompt + prefix) and records every call."""

    def __init__(self, script):
        self.script = {tuple(k): v for k, v in script.items()}
        self.calls = []

    def generate(self, contexts, n, max_new_tokens, *, temperature=1.0, top_p=1.0, seed=None, keys=None):
        self.calls.append({"contexts": [tuple(c) for c in contexts], "n": n, "max_new": max_new_tokens, "seed": seed})
        budgets = [max_new_tokens] * len(contexts) if isinstance(max_new_tokens, int) else max_new_tokens
        out = []
        for c, m in zip(contexts, budgets):
            comps = self.script[tuple(c)]
            assert len(comps) == n and all(len(x.token_ids) <= m for x in comps)
            out.append(comps)
        return out

    def sync_weights(self, model):
        pass


Q = (100, 101)


def figure1_script():
    """Fig. 1 (a): G = 4, two wrong answers, correct answers of 6 and 5 tokens; (c): 4 new branches."""
    return {
        Q: [comp([10, 11, 12, EOS]),
            comp([13, 14, 15, EOS]),
            comp([30, 31, 32, 33, ANSWER, EOS], [0.1, 0.1, 9.0, 0.1, 0.1, 0.1]),  # highest entropy, not selected
            comp([20, 21, 22, ANSWER, EOS], [0.3, 2.0, 0.2, 0.5, 0.4])],  # H after token 20 = 2.0
        # the expansion from w^b: 3 correct tokens, 4 and 5 correct tokens, 3 wrong ones (Fig. 1 (d))
        Q + (20,): [comp([40, ANSWER, EOS], [0.2, 1.5, 0.1]),
                    comp([41, 42, ANSWER, EOS]),
                    comp([43, 44, 45, ANSWER, EOS]),
                    comp([46, 47, EOS])],
    }


def test_figure1_selection_backtracking_expansion_and_next_selection():
    engine = ScriptedEngine(figure1_script())
    (tree,) = build_trees(engine, [Q], [correct], group_size=4, k=1, budget=16, seed=5)

    # (a) the initial group: the root has G = 4 children
    assert engine.calls[0] == {"contexts": [Q], "n": 4, "max_new": 16, "seed": 5}
    assert [tree.segments[i].leaf.correct for i in tree.leaves()[:4]] == [False, False, True, True]
    # (b) selection: the shortest correct path (5 tokens), not the 6-token one with the larger entropy
    assert tree.selected == [{"iteration": 1, "leaf": 3, "length": 5}]
    # ... and w^b is its highest-entropy token, the first one (depth 1)
    b = tree.backtracking[0]
    assert (b["iteration"], b["depth"], b["path_length"], b["entropy"], b["leaf"]) == (1, 1, 5, 2.0, 3)
    # (c) expansion: G new continuations of q + o_{1..t*}, within the budget, in one engine call
    assert engine.calls[1] == {"contexts": [Q + (20,)], "n": 4, "max_new": [15], "seed": 6}
    wb = tree.segments[b["segment"]]
    assert wb.token_ids == [20] and wb.ends_in_B and len(wb.children) == 4 + 1
    assert wb.children[0] == 3 and tree.segments[3].token_ids == [21, 22, ANSWER, EOS]  # the old branch first
    # (d) the next selection: the new 4-token correct path through w^b
    new = best_leaf(tree)
    assert tree.path_tokens(new) == [20, 40, ANSWER, EOS] and tree.segments[new].leaf.length == 4
    assert len(tree.leaves()) == 8 and tree.n_tokens == 4 + 4 + 6 + 5 + 3 + 4 + 5 + 3
    assert keep_tree(tree)


def test_second_iteration_skips_the_token_already_in_b():
    script = figure1_script()
    script[Q + (20, 40)] = [comp([ANSWER, EOS])] * 4
    engine = ScriptedEngine(script)
    (tree,) = build_trees(engine, [Q], [correct], group_size=4, k=2, budget=16)
    # Iteration 2 selects [20, 40, 7, EOS]; token 20 (H 2.0) is in B, so the next best is 40 (H 1.5).
    assert tree.selected[1]["length"] == 4 and tree.path_tokens(tree.selected[1]["leaf"]) == [20, 40, ANSWER, EOS]
    b2 = tree.backtracking[1]
    assert (b2["depth"], b2["entropy"]) == (2, 1.5)
    assert engine.calls[2]["contexts"] == [Q + (20, 40)] and engine.calls[2]["max_new"] == [14]
    assert [tree.segments[s].ends_in_B for s in (tree.backtracking[0]["segment"], b2["segment"])] == [True, True]
    assert len(tree.segments[b2["segment"]].children) == 5


def test_no_bfs_backtracks_at_the_highest_entropy_token_of_the_whole_tree():
    engine = ScriptedEngine(figure1_script())
    engine.script[Q + (30, 31)] = [comp([ANSWER, EOS])] * 4
    (tree,) = build_trees(engine, [Q], [correct], group_size=4, k=1, budget=16, selection="entropy")
    b = tree.backtracking[0]
    # Eq. 11: H after token 31 (= 9.0) is the tree's maximum although its path is not the best one
    assert (b["depth"], b["entropy"], b["leaf"], b["path_length"]) == (2, 9.0, 2, 6)
    assert engine.calls[1]["contexts"] == [Q + (30, 31)] and tree.selected == []


def test_k0_is_the_dapo_group():
    engine = ScriptedEngine(figure1_script())
    (tree,) = build_trees(engine, [Q], [correct], group_size=4, k=0, budget=16)
    assert len(engine.calls) == 1 and len(tree.leaves()) == 4 and tree.root_children == [0, 1, 2, 3]
    assert tree.backtracking == [] and not any(s.ends_in_B for s in tree.segments)
    assert tree.n_tokens == tree.n_chain_tokens == 4 + 4 + 6 + 5


def test_every_round_is_one_engine_call_for_all_expanding_trees():
    q2, q3 = (200,), (300,)
    script = figure1_script()
    script[q2] = [comp([50, 51, ANSWER, EOS], [0.1, 0.1, 3.0, 0.1])] + [comp([52, EOS])] * 3
    script[q3] = [comp([60, EOS])] * 4  # never correct: stops at the first selection
    script[q2 + (50, 51)] = [comp([ANSWER, EOS])] * 4
    script[Q + (20, 40)] = [comp([ANSWER, EOS])] * 4
    script[q2 + (50,)] = [comp([ANSWER, EOS])] * 4
    engine = ScriptedEngine(script)
    trees = build_trees(engine, [Q, q2, q3], [correct] * 3, group_size=4, k=2, budget=16)
    assert [c["contexts"] for c in engine.calls] == [
        [Q, q2, q3],
        [Q + (20,), q2 + (50, 51)],  # q3 has no correct path and stops
        [Q + (20, 40), q2 + (50,)],  # in q2 token 51 is in B; only 50 is left on the new best path [50, 51, 7, EOS]
    ]
    assert trees[2].stopped == {"iteration": 1, "reason": "no correct path"} and not keep_tree(trees[2])
    assert [len(t.backtracking) for t in trees] == [2, 2, 0]


@pytest.mark.parametrize("selection", ["bfs", "entropy"])
def test_first_samples_filter_drops_a_question_before_any_expansion(selection):
    """Q's first answers are mixed (Fig. 1); q2's are all correct, q3's all wrong. With 'all_leaves'
    q2 is expanded (and kept, since one of its expansion answers fails), and so is q3 without BFS; with
    'first_samples' neither is: the expansion calls hold Q's prefixes only, and both are dropped."""
    q2, q3 = (200,), (300,)
    script = figure1_script()
    script[Q + (20, 40)] = [comp([ANSWER, EOS])] * 4
    script[Q + (30, 31)] = script[Q + (30, 31, 32)] = [comp([ANSWER, EOS])] * 4
    script[q2] = [comp([50, 51, ANSWER, EOS], [0.1, 0.1, 3.0, 0.1])] * 4
    script[q2 + (50, 51)] = [comp([ANSWER, EOS])] * 3 + [comp([52, EOS])]
    script[q2 + (50,)] = [comp([51, ANSWER, EOS])] * 4
    script[q3] = [comp([60, 61, EOS], [0.1, 4.0, 0.1])] * 4
    script[q3 + (60,)] = [comp([ANSWER, EOS])] + [comp([62, EOS])] * 3
    script[q3 + (60, 62)] = [comp([ANSWER, EOS])] * 4
    expanded = {}
    for filter in ("all_leaves", "first_samples"):
        engine = ScriptedEngine(script)
        trees = build_trees(engine, [Q, q2, q3], [correct] * 3, group_size=4, k=2, budget=16, selection=selection,
                            filter=filter)
        expanded[filter] = {c[0] for call in engine.calls[1:] for c in call["contexts"]}
        assert [keep_tree(t, filter) for t in trees] == (
            [True, True, selection == "entropy"] if filter == "all_leaves" else [True, False, False])
        # trees built under 'first_samples' are kept or dropped alike by both readings
        if filter == "first_samples":
            assert [keep_tree(t, "all_leaves") for t in trees] == [True, False, False]
    assert expanded["first_samples"] == {Q[0]} and expanded["all_leaves"] >= {Q[0], q2[0]}
    assert (q3[0] in expanded["all_leaves"]) is (selection == "entropy")
    assert trees[1].stopped == {"iteration": 1, "reason": "first samples all correct"}
    assert trees[2].stopped == {"iteration": 1, "reason": "first samples all wrong"}
    assert len(trees[1].leaves()) == len(trees[2].leaves()) == 4 and not trees[1].backtracking


def test_first_samples_filter_makes_no_expansion_call_when_every_question_is_dropped():
    script = {Q: [comp([ANSWER, 11, EOS], [0.1, 0.3, 0.2])] * 4, (200,): [comp([12, EOS])] * 4}
    engine = ScriptedEngine(script)
    trees = build_trees(engine, [Q, (200,)], [correct] * 2, group_size=4, k=3, budget=8, filter="first_samples")
    assert len(engine.calls) == 1 and not any(keep_tree(t, "first_samples") for t in trees)
    # K = 0 is DAPO's group under either reading: nothing to stop
    (tree,) = build_trees(ScriptedEngine(script), [Q], [correct], group_size=4, k=0, budget=8, filter="first_samples")
    assert tree.stopped is None
    with pytest.raises(BfspoError, match="unknown filter"):
        build_trees(ScriptedEngine(script), [Q], [correct], group_size=4, k=1, budget=8, filter="leaves")


def test_no_correct_answer_stops_bfs_but_not_no_bfs():
    script = {Q: [comp([10, 11, EOS], [0.1, 0.5, 0.2])] * 4, Q + (10,): [comp([12, EOS])] * 4}
    engine = ScriptedEngine(script)
    (tree,) = build_trees(engine, [Q], [correct], group_size=4, k=3, budget=8)
    assert len(engine.calls) == 1 and tree.stopped == {"iteration": 1, "reason": "no correct path"}
    assert tree.n_correct == 0 and not keep_tree(tree)
    engine = ScriptedEngine(script)
    (tree,) = build_trees(engine, [Q], [correct], group_size=4, k=1, budget=8, selection="entropy")
    assert len(engine.calls) == 2 and tree.backtracking[0]["depth"] == 1


def test_all_correct_and_equal_length_selects_the_earliest_leaf():
    script = {Q: [comp([ANSWER, 11, EOS], [0.1, 0.3 + i, 0.2]) for i in range(4)],
              Q + (ANSWER,): [comp([12, EOS])] * 4}
    engine = ScriptedEngine(script)
    (tree,) = build_trees(engine, [Q], [correct], group_size=4, k=1, budget=8)
    assert tree.selected[0] == {"iteration": 1, "leaf": 0, "length": 3}
    assert tree.backtracking[0]["entropy"] == 0.3  # from leaf 0, although leaf 3 has 3.3
    assert not keep_tree(tree)  # nothing to learn from: every leaf is correct


def test_backtracking_one_token_before_the_budget():
    budget = 5
    # the only correct path ends with EOS exactly at the budget; its highest entropy is after depth 4
    script = {Q: [comp([20, 21, 22, ANSWER, EOS], [0.1, 0.1, 0.1, 0.1, 5.0])]
              + [comp([24, EOS])] * 2,
              Q + (20, 21, 22, ANSWER): [comp([EOS])] * 3}
    engine = ScriptedEngine(script)
    (tree,) = build_trees(engine, [Q], [correct], group_size=3, k=1, budget=budget)
    assert tree.backtracking[0]["depth"] == 4 and engine.calls[1]["max_new"] == [1]
    new = tree.leaves()[3:]
    assert [tree.path_tokens(i) for i in new] == [[20, 21, 22, ANSWER, EOS]] * 3
    assert all(tree.segments[i].leaf.length == budget and tree.segments[i].leaf.finished for i in new)


def test_a_token_with_no_room_left_is_never_a_backtracking_point():
    t = SearchTree(prompt_ids=list(Q), budget=4)
    t.add_completion(None, [20, 21, 22, ANSWER], [0.0] * 4, [0.1, 0.3, 0.2, 0.1], False, 0)
    t.segments[0].leaf.correct = True
    # a logged tree whose engine also reported an entropy after the last token, at depth = budget
    d = t.to_dict()
    d["segments"][0]["entropy_after"][-1] = 99.0
    t = SearchTree.from_dict(d)
    (seg, off), leaf, _ = backtracking_point(t, "bfs")
    assert (seg, off, leaf) == (0, 0, 0)  # H 0.3 after token 20 (depth 1), not the 99.0 at depth 4
    # a path whose every non-final token is unusable leaves no backtracking point: expansion stops
    t2 = SearchTree(prompt_ids=list(Q), budget=4)
    t2.add_completion(None, [ANSWER], [0.0], [0.5], True, 0)
    t2.segments[0].leaf.correct = True
    assert backtracking_point(t2, "bfs") == (None, 0, "no backtracking token left")
    engine = ScriptedEngine({Q: [comp([ANSWER])] * 2})
    (tree,) = build_trees(engine, [Q], [correct], group_size=2, k=2, budget=4)
    assert tree.stopped == {"iteration": 1, "reason": "no backtracking token left"} and len(engine.calls) == 1


def test_invalid_settings_are_reported():
    engine = ScriptedEngine(figure1_script())
    with pytest.raises(BfspoError, match="selection"):
        build_trees(engine, [Q], [correct], group_size=4, k=1, budget=16, selection="best")
    with pytest.raises(BfspoError):
        build_trees(engine, [Q], [correct], group_size=0, k=1, budget=16)
    with pytest.raises(ValueError):
        build_trees(engine, [Q], [], group_size=4, k=1, budget=16)


# ------------------------------------------------------------------ cut-off answers (issue 22)

CUT_OFF_TAIL = "4. Eliminate the extraneces (where Sarasons sleep"


class Words:
    """A word-level stand-in for a tokenizer: id 1 is EOS (decodes to nothing), others are words."""

    def __init__(self):
        self.ids: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        return [self.ids.setdefault(w, 200 + len(self.ids)) for w in text.split()]

    def decode(self, ids) -> str:
        words = {i: w for w, i in self.ids.items()}
        return " ".join(words[i] for i in ids if i != EOS)


def rambling_answer(words: Words, n_tokens: int) -> list[int]:
    """A rambling answer of exactly n_tokens that stops mid-list at "4. Eliminate the ..."."""
    tail = words.encode(CUT_OFF_TAIL)
    filler = words.encode("First we read the question again and think about what it asks .")
    body = (filler * n_tokens)[: n_tokens - len(tail)]
    return body + tail


def gsm8k_scorer(words: Words, gold: str):
    from bfspo.tasks.verify import is_correct

    return lambda ids: is_correct("gsm8k", words.decode(ids), gold)


def test_the_issues_cut_off_answer_is_wrong_for_reward_selection_and_filter():
    """Issue 22: a 128-token answer cut off by the budget mid-list, "4. Eliminate the ...", gold 4.
    Read as written the verifier takes its last number, 4; in training the chain gave no answer."""
    from bfspo.algorithm.advantages import assign_rewards

    words = Words()
    cut = rambling_answer(words, 128)
    wrong = words.encode("The answer is 5 .") + [EOS]
    score = gsm8k_scorer(words, "4")
    assert score(cut)  # the reading as written: the list number counts as the answer
    engine = ScriptedEngine({Q: [comp(cut, finished=False), comp(wrong)]})
    (tree,) = build_trees(engine, [Q], [score], group_size=2, k=1, budget=128)
    assert [tree.segments[i].leaf.correct for i in tree.leaves()] == [False, False]
    assert best_leaf(tree) is None and tree.stopped == {"iteration": 1, "reason": "no correct path"}
    assert not keep_tree(tree) and len(engine.calls) == 1  # no backtracking at depth 127
    assert tree.segments[0].leaf.length == 128 and not tree.segments[0].leaf.finished
    assign_rewards(tree)
    assert tree.segments[0].leaf.reward == -2.0  # Eq. 4 with v = 0, plus R_l = -1 at the budget


def test_a_cut_off_answer_counts_as_wrong_beside_finished_ones():
    """The same text is correct once it ends with EOS; cut off, it turns an all-correct group (no
    signal) into one with signal, and is never the path that Eq. 5 selects."""
    words = Words()
    right = words.encode("2 + 2 = 4 . The answer is 4 .") + [EOS]
    cut = words.encode("2 + 2 = 4 . The answer is 4 . Also")
    score = gsm8k_scorer(words, "4")
    script = {Q: [comp(cut, finished=False), comp(right), comp(right)],
              Q + tuple(right[:1]): [comp(right[1:])] * 3}
    engine = ScriptedEngine(script)
    (tree,) = build_trees(engine, [Q], [score], group_size=3, k=1, budget=len(cut))
    first = [tree.segments[i].leaf for i in tree.leaves()[:3]]
    assert [(leaf.correct, leaf.finished) for leaf in first] == [(False, False), (True, True), (True, True)]
    assert tree.selected[0]["leaf"] == 1 and keep_tree(tree)
