"""The row one training step logs, in sections as TRL and verl name them, and the one place its
rollout statistics are computed (`rollout_stats`).

One row goes both to metrics.jsonl and to W&B, with the same keys:

- `rollout/`: reward, accuracy and length of the first samples (Alg. 1 line 2; the G answers DAPO
  would also sample), with their spread, the shortest, the mean length of the finished ones (ended
  with EOS), the fraction cut off at the budget, the length reward R_l (Eq. 3) as its own term,
  entropy, dynamic-sampling counts (the fraction of groups filtered out, the chains generated against
  `chains` trained on; the questions asked, `keep_rate`, the chains kept over the chains the generated
  questions would hold fully expanded, `keep_rate_est`, the run's estimate of it before the step, and
  `ask_rate`, the questions asked per question needed that the step used: bfspo.training.batching
  `ask_rate`) and token counts (`tokens_generated`, every token the engine generated,
  `tokens_aborted` of them on trees a step dropped after its batch's prefix: bfspo.training.batching
  `prefix` and `fill_streamed`, with `questions_aborted`); the engine's occupancy (the mean sequences it decoded per
  engine step over the most it can, vLLM's max_num_seqs or the transformers engine's
  rollout_batch_size) and its engine steps;
- `tree/`: depth, backtracks and their depth, branching nodes and the tied ones (children with
  equal branch advantages: no signal at that node);
- `advantage/`: mean, std, min, max and fraction zero of the token advantages trained on;
- `train/`: loss, grad_norm, lr, clip fractions, ratio, approx_kl, optimizer steps and skipped
  steps, present at every step (NaN when the step made no update); the questions and tokens
  generated since the run began, and the epoch (questions over the training set);
- `timing/`: seconds of the whole step and of its rollout, old log-probs, update and validation;
  tokens/s; peak memory;
- `val-core/`: greedy accuracy and length on the held-out questions (`val_every`; verl's names),
  on the steps that run validation.
"""

from __future__ import annotations

import math

import numpy as np

from bfspo.algorithm.advantages import per_chain
from bfspo.errors import BfspoError

# flat statistic -> sectioned key
SECTIONS = {
    "reward_mean": "rollout/reward_mean", "reward_std": "rollout/reward_std",
    "accuracy": "rollout/accuracy", "accuracy_std": "rollout/accuracy_std",
    "len_mean": "rollout/len_mean", "len_std": "rollout/len_std", "len_max": "rollout/len_max",
    "len_min": "rollout/len_min", "len_finished_mean": "rollout/len_finished_mean",
    "cutoff_frac": "rollout/cutoff_frac", "overlong_mean": "rollout/overlong_mean",
    "overlong_frac": "rollout/overlong_frac",
    "accuracy_all_leaves": "rollout/accuracy_all_leaves", "len_mean_all_leaves": "rollout/len_mean_all_leaves",
    "best_len_mean": "rollout/best_len_mean", "entropy_mean": "rollout/entropy_mean",
    "entropy_max": "rollout/entropy_max", "groups_kept": "rollout/groups_kept",
    "groups_filtered": "rollout/groups_filtered", "filtered_frac": "rollout/filtered_frac", "gen_rounds": "rollout/gen_rounds", "chains": "rollout/chains",
    "chains_generated": "rollout/chains_generated",
    "questions_asked": "rollout/questions_asked", "questions_generated": "rollout/questions_generated",
    "questions_kept": "rollout/questions_kept", "chains_kept": "rollout/chains_kept",
    "keep_rate": "rollout/keep_rate", "keep_rate_est": "rollout/keep_rate_est", "ask_rate": "rollout/ask_rate",
    "trees": "rollout/trees", "chains_target": "rollout/chains_target", "batch_full": "rollout/batch_full",
    "tokens_unique": "rollout/tokens_unique", "tokens_total": "rollout/tokens_total",
    "rollout_tokens": "rollout/tokens_generated", "tokens_aborted": "rollout/tokens_aborted",
    "questions_aborted": "rollout/questions_aborted", "packing_gain": "rollout/packing_gain",
    "verify_timeouts": "rollout/verify_timeouts", "occupancy": "rollout/occupancy",
    "engine_steps": "rollout/engine_steps",
    "logprob_gap_mean": "rollout/logprob_gap_mean", "logprob_gap_max": "rollout/logprob_gap_max",
    "tree_depth_max": "tree/depth_max", "tree_depth_mean": "tree/depth_mean", "backtracks": "tree/backtracks",
    "backtrack_depth_mean": "tree/backtrack_depth_mean", "branching_nodes": "tree/branching_nodes",
    "tied_branching_nodes": "tree/tied_branching_nodes",
    "adv_mean": "advantage/mean", "adv_std": "advantage/std", "adv_min": "advantage/min", "adv_max": "advantage/max",
    "adv_zero_frac": "advantage/zero_frac",
    "loss": "train/loss", "grad_norm": "train/grad_norm", "lr": "train/lr", "clip_frac": "train/clip_frac",
    "clip_frac_low": "train/clip_frac_low", "clip_frac_high": "train/clip_frac_high",
    "ratio_mean": "train/ratio_mean", "ratio_max": "train/ratio_max", "approx_kl": "train/approx_kl",
    "optimizer_steps": "train/optimizer_steps", "skipped_steps": "train/skipped_steps",
    "nonfinite": "train/nonfinite_total", "questions_seen": "train/questions_seen",
    "tokens_seen": "train/tokens_seen", "epoch": "train/epoch",
    "step_s": "timing/step_s", "val_s": "timing/val_s", "rollout_s": "timing/rollout_s", "old_logprobs_s": "timing/old_logprobs_s", "update_s": "timing/update_s",
    "rollout_tok_s": "timing/rollout_tok_s", "train_tok_s": "timing/train_tok_s", "peak_mem_gb": "timing/peak_mem_gb",
    "val_accuracy": "val-core/accuracy", "val_len_mean": "val-core/len_mean",
    "val_cutoff_frac": "val-core/cutoff_frac", "val_questions": "val-core/questions",
    "rescore_s": "timing/rescore_s", "rescore_tokens": "timing/rescore_tokens",
    "rescore_padding": "timing/rescore_padding",
}
# `train/` statistics every row carries: NaN on a step without an update, no optimizer step skipped
TRAIN_DEFAULTS = {k: float("nan") for k in ("loss", "grad_norm", "clip_frac", "clip_frac_low", "clip_frac_high",
                                            "ratio_mean", "ratio_max", "approx_kl", "old_logprobs_s")}
TRAIN_DEFAULTS |= {"optimizer_steps": 0, "skipped_steps": 0}
# statistics summed over ranks, and those whose maximum or minimum is kept; the others are averaged
SUMMED = frozenset({"groups_kept", "groups_filtered", "chains", "chains_generated", "tokens_unique", "tokens_total", "rollout_tokens",
                    "tokens_aborted", "questions_aborted",
                    "backtracks", "branching_nodes", "tied_branching_nodes", "verify_timeouts"})
MAXED = frozenset({"len_max", "tree_depth_max", "gen_rounds", "entropy_max", "adv_max"})
MINNED = frozenset({"len_min", "adv_min"})


def _mean(xs) -> float:
    return float(np.mean(xs)) if len(xs) else float("nan")


def _std(xs) -> float:
    return float(np.std(xs)) if len(xs) else float("nan")


def rollout_stats(generated: list, batch: list) -> dict:
    """One rank's statistics of a step's trees: the first samples (Alg. 1 line 2) and the tree
    shapes of every generated tree (before dynamic sampling), the advantages of the `batch` trees
    it trains on (after rewards and advantages are assigned)."""
    first = [t.segments[i].leaf for t in generated for i in t.leaves() if t.segments[i].iteration == 0]
    leaves = [t.segments[i].leaf for t in generated for i in t.leaves()]
    entropies = [h for t in generated for s in t.segments for h in s.entropy_after if not math.isnan(h)]
    backtracks = [b["depth"] for t in generated for b in t.backtracking]
    best = [min((t.segments[i].leaf.length for i in t.leaves() if t.segments[i].leaf.correct), default=None)
            for t in generated]
    branching = [[t.segments[c].advantage for c in t.children_of(s)]
                 for t in generated for s in [None, *range(len(t.segments))] if len(t.children_of(s)) > 1]
    overlong = [leaf.reward - (1.0 if leaf.correct else -1.0) for leaf in first]  # R_l of Eq. 4
    adv = [a for t in batch for a in token_advantages(t)]
    return {
        "reward_mean": _mean([leaf.reward for leaf in first]),
        "reward_std": _std([leaf.reward for leaf in first]),
        "accuracy": _mean([leaf.correct for leaf in first]),
        "accuracy_std": _std([leaf.correct for leaf in first]),
        "len_mean": _mean([leaf.length for leaf in first]),
        "len_std": _std([leaf.length for leaf in first]),
        "len_max": max((leaf.length for leaf in first), default=0),
        "len_min": min((leaf.length for leaf in first), default=0),
        "len_finished_mean": _mean([leaf.length for leaf in first if leaf.finished]),
        "cutoff_frac": _mean([not leaf.finished for leaf in first]),
        "overlong_mean": _mean(overlong),
        "overlong_frac": _mean([r < 0 for r in overlong]),
        "accuracy_all_leaves": _mean([leaf.correct for leaf in leaves]),
        "len_mean_all_leaves": _mean([leaf.length for leaf in leaves]),
        "best_len_mean": _mean([b for b in best if b is not None]),
        "entropy_mean": _mean(entropies),
        "entropy_max": max(entropies, default=float("nan")),
        "tree_depth_max": max((leaf.length for leaf in leaves), default=0),
        "tree_depth_mean": _mean([max(t.segments[i].end for i in t.leaves()) for t in generated if t.leaves()]),
        "backtrack_depth_mean": _mean(backtracks),
        "backtracks": len(backtracks),
        "branching_nodes": len(branching),
        "tied_branching_nodes": sum(len(set(a)) == 1 for a in branching),
        "adv_mean": _mean(adv),
        "adv_std": _std(adv),
        "adv_min": min(adv, default=float("nan")),
        "adv_max": max(adv, default=float("nan")),
        "adv_zero_frac": _mean([a == 0 for a in adv]),
    }


def rollout_row(filled, batch: list, mine: dict, merged: dict, verify_timeouts: int, occupancy: dict,
                sampling: dict) -> dict:
    """One rank's statistics of a step's rollout: `rollout_stats` of its trees, the batch statistics
    of all ranks (`merged`: bfspo.training.batching.merge_ranks of each rank's `mine`) and the
    dynamic-sampling rule's `sampling` (`keep_rate`, `keep_rate_est`, `ask_rate`: the trainer's,
    the same on every rank), and this rank's counts of chains, groups and tokens, verifier timeouts
    and the engine's `occupancy`.
    `reduce_ranks` sums the counts (SUMMED) and averages the rest: the merged batch statistics are
    the same on every rank."""
    return rollout_stats(filled.generated, batch) | merged | {
        "chains": mine["chains"], "groups_kept": len(filled.kept),
        "chains_generated": sum(len(t.leaves()) for t in filled.generated),
        "groups_filtered": len(filled.generated) - len(filled.kept),
        "tokens_unique": sum(t.n_tokens for t in batch), "tokens_total": sum(t.n_chain_tokens for t in batch),
        "rollout_tokens": sum(t.n_tokens for t in filled.generated) + filled.aborted_tokens,
        "tokens_aborted": filled.aborted_tokens, "questions_aborted": filled.aborted,
        "verify_timeouts": verify_timeouts} | occupancy | sampling


def update_stats(losses: list[float], norms: list[float], stats: list[dict], skipped: int, nonfinite: int,
                 gaps: list[tuple[float, float, int]], rescored: dict | None) -> dict:
    """The `train/` statistics of a step's optimizer steps (Eq. 10): the mean loss and gradient norm
    of the steps taken, the clip fractions, ratio and approx. KL of the mini-batches (`stats`, from
    bfspo.training.accumulate), the steps `skipped` as non-finite and the run's `nonfinite` total;
    the log-prob gap between engine and trainer from each rank's (sum, max, count) in `gaps`; and
    the rescoring's time and padding for a RescoredEngine (`rescored`, its pop_stats)."""
    mean = lambda key: _mean([s[key] for s in stats])  # noqa: E731
    count = sum(g[2] for g in gaps)
    out = {"loss": _mean(losses), "optimizer_steps": len(losses), "grad_norm": _mean(norms),
           "clip_frac": mean("clip_frac"), "clip_frac_low": mean("clip_frac_low"),
           "clip_frac_high": mean("clip_frac_high"), "ratio_mean": mean("ratio_mean"),
           "ratio_max": max((s["ratio_max"] for s in stats), default=float("nan")),
           "approx_kl": mean("approx_kl"), "skipped_steps": skipped, "nonfinite": nonfinite,
           "old_logprobs_s": 0.0,  # no pass of its own: they come with the rollout
           "logprob_gap_mean": sum(g[0] for g in gaps) / count if count else float("nan"),
           "logprob_gap_max": max(g[1] for g in gaps) if count else float("nan")}
    if rescored is not None:
        out["rescore_s"] = rescored["seconds"]
        out["rescore_tokens"] = rescored["row_tokens"]  # the forwards' rows, padding included
        out["rescore_padding"] = (1 - rescored["tokens"] / rescored["row_tokens"] if rescored["row_tokens"]
                                  else float("nan"))
    return out


def token_advantages(tree) -> list[float]:
    """The advantage of every unique token (per-segment advantages) or of every chain token (per chain)."""
    if per_chain(tree):
        return [tree.segments[i].leaf.advantage for i in tree.leaves()
                for s in tree.path(i) for _ in tree.segments[s].token_ids]
    return [s.advantage for s in tree.segments if s.advantage is not None for _ in s.token_ids]


def reduce_ranks(per_rank: list[dict]) -> dict:
    """One rank-independent dict of statistics from each rank's: SUMMED summed, MAXED and MINNED
    the largest and smallest, the others averaged over the ranks where they are not NaN."""
    out = {}
    for key in per_rank[0]:
        vals = [r[key] for r in per_rank]
        finite = [v for v in vals if not (isinstance(v, float) and math.isnan(v))]
        if key in SUMMED:
            out[key] = float(sum(vals))
        elif not finite:
            out[key] = float("nan")
        elif key in MAXED or key in MINNED:
            out[key] = max(finite) if key in MAXED else min(finite)
        else:
            out[key] = float(np.mean(finite))
    return out


def step_row(step: int, stats: dict) -> dict:
    """The sectioned row of one step: every `train/` key present; an unknown statistic is a bug."""
    flat = TRAIN_DEFAULTS | stats
    unknown = sorted(set(flat) - set(SECTIONS))
    if unknown:
        raise BfspoError(f"step {step}: statistics without a section in bfspo.training.step_metrics: "
                         f"{', '.join(unknown)}")
    return {"step": step} | {SECTIONS[k]: v for k, v in flat.items()}


# what a training run's closing summary shows (tracking.finish), and its per-step line
SUMMARY_KEYS = ["train/loss", "rollout/reward_mean", "rollout/accuracy", "rollout/len_mean", "val-core/accuracy",
                "val-core/len_mean", "train/grad_norm", "train/epoch", "timing/step_s"]


def step_line(row: dict, steps: int) -> str:
    """One readable line of a step's row: loss, reward, accuracy and length of the first samples,
    the validation numbers when the step ran validation, and the step's time."""
    parts = [f"step {row['step']}/{steps}", f"loss {row['train/loss']:.4g}", f"reward {row['rollout/reward_mean']:+.3f}",
             f"acc {row['rollout/accuracy']:.3f}", f"len {row['rollout/len_mean']:.1f}"]
    if "val-core/accuracy" in row:
        parts.append(f"val acc {row['val-core/accuracy']:.3f} len {row['val-core/len_mean']:.1f}")
    parts.append(f"{row['timing/step_s']:.1f} s")
    return " | ".join(parts)
