"""The sectioned step row: every section's keys, train/ present (NaN) on a step without an update."""

import math

import pytest

from bfspo.errors import BfspoError
from bfspo.training import step_metrics


def test_a_step_without_update_still_has_every_train_key():
    row = step_metrics.step_row(3, {"reward_mean": 0.5, "loss": float("nan"), "optimizer_steps": 0})
    assert row["step"] == 3 and row["rollout/reward_mean"] == 0.5
    train = {k for k in row if k.startswith("train/")}
    assert {"train/loss", "train/grad_norm", "train/clip_frac", "train/ratio_max", "train/approx_kl",
            "train/skipped_steps", "train/optimizer_steps"} <= train
    assert math.isnan(row["train/grad_norm"]) and row["train/skipped_steps"] == 0


def test_every_key_has_a_section():
    assert all(v.split("/")[0] in {"rollout", "tree", "advantage", "train", "timing", "val-core"}
               for v in step_metrics.SECTIONS.values())
    with pytest.raises(BfspoError, match="without a section.*mystery"):
        step_metrics.step_row(1, {"mystery": 1.0})


def test_ranks_are_summed_maxed_minned_or_averaged_ignoring_nan():
    merged = step_metrics.reduce_ranks([
        {"chains": 4, "len_max": 9, "len_min": 3, "accuracy": 0.5, "adv_mean": float("nan"), "adv_min": float("nan")},
        {"chains": 6, "len_max": 7, "len_min": 5, "accuracy": 1.0, "adv_mean": 0.2, "adv_min": -0.7}])
    assert merged == {"chains": 10.0, "len_max": 9, "len_min": 3, "accuracy": 0.75, "adv_mean": 0.2, "adv_min": -0.7}


def test_rollout_stats_of_figure1():
    from bfspo.algorithm.advantages import assign_advantages, assign_rewards
    from bfspo.algorithm.search import build_trees
    from tests.test_search import Q, ScriptedEngine, correct, figure1_script

    (tree,) = build_trees(ScriptedEngine(figure1_script()), [Q], [correct], group_size=4, k=1, budget=16, seed=5)
    assign_rewards(tree, overlong=True)
    assign_advantages(tree, "branch")
    stats = step_metrics.rollout_stats([tree], [tree])
    adv = step_metrics.token_advantages(tree)
    assert len(adv) == tree.n_tokens
    assert stats["adv_zero_frac"] == pytest.approx(sum(a == 0 for a in adv) / len(adv))
    assert (stats["adv_min"], stats["adv_max"]) == (min(adv), max(adv)) and stats["adv_min"] < 0 < stats["adv_max"]
    # the first samples are 4, 4, 6 and 5 tokens long (Fig. 1 (a)), all finished, none penalised
    assert (stats["len_min"], stats["len_max"], stats["len_finished_mean"]) == (4, 6, 4.75)
    assert stats["overlong_mean"] == 0.0 and stats["accuracy"] == 0.5 and stats["backtracks"] == 1
    assert stats["branching_nodes"] == 2  # the root (4 first samples) and the backtracking point (4 expansions)
    assert stats["tied_branching_nodes"] == 0 and stats["cutoff_frac"] == 0.0 and stats["accuracy_std"] == 0.5
    assert stats["tree_depth_mean"] == max(tree.segments[i].end for i in tree.leaves())


def test_length_reward_and_finished_lengths_of_first_samples():
    """Four first samples of 10, 14, 20 (cut off at the budget) and 8 tokens, budget 20 (paper window:
    Eq. 3's penalty is 0 up to 12 tokens, then -1/4 per token down to -1 at 16): R_l = 0, -0.5, -1, 0."""
    from bfspo.algorithm.advantages import assign_advantages, assign_rewards
    from bfspo.algorithm.tree import SearchTree

    tree = SearchTree(prompt_ids=[1], budget=20)
    for n, correct, finished in [(10, True, True), (14, True, True), (20, False, False), (8, False, True)]:
        leaf = tree.add_completion(None, [5] * n, [-0.1] * n, [0.5] * n, finished=finished, iteration=0)
        tree.segments[leaf].leaf.correct = correct
    assign_rewards(tree, overlong=True, window="paper")
    assign_advantages(tree, "branch")
    stats = step_metrics.rollout_stats([tree], [])
    assert stats["overlong_mean"] == pytest.approx(-0.375) and stats["overlong_frac"] == 0.5
    assert stats["len_min"] == 8 and stats["len_finished_mean"] == pytest.approx(32 / 3)
    assert stats["cutoff_frac"] == 0.25 and stats["reward_mean"] == pytest.approx((1 + 0.5 - 2 - 1) / 4)
    assert math.isnan(stats["adv_mean"]) and math.isnan(stats["adv_max"])  # no tree trained on


def test_sample_table_renders_the_first_trees_as_bfspo_tree_show_does():
    from bfspo.algorithm.advantages import assign_advantages, assign_rewards
    from bfspo.algorithm.search import build_trees
    from bfspo.algorithm.tree_text import render_tree
    from bfspo.training.samples import sample_table
    from tests.test_search import Q, ScriptedEngine, correct, figure1_script

    trees = build_trees(ScriptedEngine(figure1_script()), [Q, Q], [correct, correct], group_size=4, k=1, budget=16)
    for i, tree in enumerate(trees):
        assign_rewards(tree, overlong=True)
        assign_advantages(tree, "branch")
        tree.meta["question_id"] = f"q{i}"
    dicts = [t.to_dict() for t in trees]
    table = sample_table(dicts, step=7, n=1)
    assert table.to_dict("records") == [{
        "step": 7, "question_id": "q0", "leaves": len(trees[0].leaves()), "correct": trees[0].n_correct,
        "best_length": dicts[0]["best"]["length"], "backtracks": len(trees[0].backtracking),
        "tree": render_tree(dicts[0], title="step 7, question q0")}]


def test_update_stats_of_a_steps_optimizer_steps():
    """The `train/` statistics that Trainer.update assembled inline (issue 48 §3: update() is the loop)."""
    stats = [{"clip_frac": 0.1, "clip_frac_low": 0.0, "clip_frac_high": 0.1, "ratio_mean": 1.0, "ratio_max": 1.2,
              "approx_kl": 0.01},
             {"clip_frac": 0.3, "clip_frac_low": 0.1, "clip_frac_high": 0.2, "ratio_mean": 1.1, "ratio_max": 1.5,
              "approx_kl": 0.03}]
    out = step_metrics.update_stats([0.5, 1.5], [2.0, 4.0], stats, 1, 3, [(1.0, 0.4, 4), (2.0, 0.9, 2)],
                                    {"seconds": 1.5, "row_tokens": 100, "tokens": 80})
    assert out["loss"] == 1.0 and out["grad_norm"] == 3.0 and out["optimizer_steps"] == 2
    assert out["clip_frac"] == pytest.approx(0.2) and out["ratio_max"] == 1.5 and out["approx_kl"] == pytest.approx(0.02)
    assert (out["skipped_steps"], out["nonfinite"], out["logprob_gap_mean"], out["logprob_gap_max"]) == (1, 3, 0.5, 0.9)
    assert (out["rescore_s"], out["rescore_tokens"], out["rescore_padding"]) == (1.5, 100, pytest.approx(0.2))
    empty = step_metrics.update_stats([], [], [], 2, 2, [(0.0, 0.0, 0)], None)
    assert empty["optimizer_steps"] == 0 and "rescore_s" not in empty
    assert all(math.isnan(empty[k]) for k in ("loss", "grad_norm", "clip_frac", "ratio_max", "logprob_gap_mean"))
    step_metrics.step_row(1, out | empty)  # every key has its section
