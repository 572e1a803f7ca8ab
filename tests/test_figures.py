"""`bfspo figures`: the Pareto front, training curves and backtracking histograms of one table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bfspo.cli import main
from bfspo.errors import BfspoError
from bfspo.reporting import figures
from bfspo.reporting.figures import _seed_curves, backtracking_depths, pareto_front
from bfspo.reporting.style import (
    EMA_ALPHA,
    MAX_LUMINANCE,
    PALETTE,
    ZERO_SHOT_COLOUR,
    colour_distance,
    distinct_colours,
    luminance,
    method_colour,
    method_colours,
)

SPEC = {
    "name": "abl",
    "title": "toy",
    "layout": "ablation",
    "models": [{"key": "m", "label": "Model-1B"}],
    "methods": [
        {"key": "dapo", "label": "DAPO", "paper": "dapo", "k": 0, "advantage": "branch", "overlong": True},
        {"key": "bfspo", "label": "BFS-PO", "paper": "bfspo", "k": 3, "advantage": "branch", "overlong": True},
    ],
    "columns": [{"train_set": "ts", "benchmark": "b", "label": "B"}, {"train_set": "ts", "benchmark": "o", "label": "O"}],
}


def test_pareto_front():
    points = [(100, 50.0), (120, 60.0), (110, 40.0), (200, 60.0), (90, 30.0), (100, 45.0)]
    # (200, 60) is dominated by (120, 60); (110, 40) by (100, 50); (100, 45) by (100, 50).
    assert pareto_front(points) == [4, 0, 1]
    assert pareto_front([]) == []


def write_run(runs_dir: Path, run: str, steps: int, depths: list[tuple[int, int]]) -> None:
    d = runs_dir / run
    (d / "trees").mkdir(parents=True)
    (d / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "rollout/reward_mean": 0.1 * s, "rollout/accuracy": 0.5 + 0.01 * s,
                    "rollout/len_mean": 200 - s}) + "\n"
        for s in range(1, steps + 1)))
    tree = {"backtracking": [{"iteration": i, "depth": a, "path_length": b, "entropy": 1.0} for i, (a, b) in enumerate(depths)]}
    (d / "trees" / "step_00001.jsonl").write_text(json.dumps(tree) + "\n" + json.dumps({"backtracking": []}) + "\n")
    (d / "done.json").write_text("{}")


def summaries(tmp_path: Path) -> list[str]:
    paths = []
    for run, method, acc, length in [("m_zero-shot", "zero-shot", 60.0, 200.0), ("m_ts_dapo_s0", "dapo", 62.0, 190.0),
                                     ("m_ts_bfspo_s0", "bfspo", 63.0, 150.0), ("m_ts_bfspo_s1", "bfspo", 61.0, 160.0)]:
        for bench in ("b", "o"):
            meta = {"run": run, "model": "m", "method": method}
            if method != "zero-shot":
                meta["train_set"] = "ts"
            p = tmp_path / "eval" / run / bench / "summary.json"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps({"benchmark": bench, "accuracy": acc, "avg_length": length, "meta": meta}))
            paths.append(str(p))
    return paths


def test_backtracking_depths(tmp_path):
    write_run(tmp_path, "r", 2, [(10, 40), (30, 60)])
    assert backtracking_depths(tmp_path / "r") == ([10, 30], [0.25, 0.5])


def test_figures_of_a_table(tmp_path, capsys):
    runs_dir = tmp_path / "runs"
    write_run(runs_dir, "m_ts_dapo_s0", 3, [])
    write_run(runs_dir, "m_ts_bfspo_s0", 3, [(10, 40), (30, 60)])
    write_run(runs_dir, "m_ts_bfspo_s1", 2, [(20, 40)])
    out = tmp_path / "fig"
    args = ["figures", "--spec", json.dumps(SPEC), "--summaries", *summaries(tmp_path), "--runs-dir", str(runs_dir),
            "--out-dir", str(out)]
    assert main(args) == 0
    stems = {"pareto_ts_b", "pareto_ts_o", "curves_m_ts", "backtracking_m_ts"}
    assert {p.name for p in out.iterdir()} == {f"{s}.{e}" for s in stems for e in ("png", "pdf")}
    for stem in stems:
        assert (out / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / f"{stem}.pdf").read_bytes()[:5] == b"%PDF-"


def test_runs_without_metrics_or_trees_still_get_their_pareto_figures(tmp_path, capsys):
    out = tmp_path / "fig"
    args = ["figures", "--spec", json.dumps(SPEC), "--summaries", *summaries(tmp_path), "--runs-dir",
            str(tmp_path / "none"), "--out-dir", str(out)]
    assert main(args) == 0
    assert sorted(p.name for p in out.iterdir()) == ["pareto_ts_b.pdf", "pareto_ts_b.png", "pareto_ts_o.pdf", "pareto_ts_o.png"]
    err = capsys.readouterr().err
    assert "no metrics.jsonl for m / ts" in err and "no logged trees for m / ts" in err


def test_a_backtracking_record_without_depth_is_named(tmp_path, capsys):
    d = tmp_path / "r" / "trees"
    d.mkdir(parents=True)
    (d / "step_00001.jsonl").write_text(json.dumps({"backtracking": [{"iteration": 0}]}) + "\n")
    with pytest.raises(BfspoError, match=r"step_00001.jsonl:1: a backtracking record without a depth"):
        backtracking_depths(tmp_path / "r")


def test_each_method_key_has_one_colour_in_every_config():
    """A key means one colour whatever the config (issue 26: orange was K=1 in one config and
    "prompts" in another), the shipped keys all differ, and other keys avoid theirs."""
    import yaml

    from bfspo.reporting.style import METHOD_COLOURS

    root = Path(__file__).resolve().parents[1]
    keys = {k for f in (root / "config").glob("*.yaml") for k in yaml.safe_load(f.read_text()).get("methods", {})}
    assert keys <= set(METHOD_COLOURS) and len(set(METHOD_COLOURS.values())) == len(METHOD_COLOURS)
    assert method_colour({"key": "dapo"}) == "#1f77b4" and method_colour({"key": "bfspo"}) == "#d62728"
    assert method_colour({"key": "dapo", "color": "tab:red"}) == "#d62728"
    assert method_colour({"key": "my-variant"}) is None  # its table picks it (method_colours)
    assert method_colour({"key": "zero-shot"}) == ZERO_SHOT_COLOUR


def test_new_methods_get_colours_distinct_from_every_other_in_their_table():
    """Issue 33: a K = 4 row drew in lavender beside "w/o BFS"'s purple (a hash into tab20's light
    shades). Each new key now takes the pool colour farthest from those its table uses, and keeps it."""
    import yaml

    root = Path(__file__).resolve().parents[1]
    toy = yaml.safe_load((root / "config/config.yaml").read_text())
    keys = ["zero-shot", *toy["tables"]["toy-ablation"]["methods"], "bfspo-k4", "bfspo-k5", "leaf-adv", "bfspo-g16"]
    colours = method_colours([{"key": k} for k in keys])
    assert len(set(colours.values())) == len(keys)
    shipped = [c for k, c in colours.items() if method_colour({"key": k})]
    closest_shipped = min(colour_distance(a, b) for i, a in enumerate(shipped) for b in shipped[i + 1:])
    for new in ("bfspo-k4", "bfspo-k5", "leaf-adv", "bfspo-g16"):
        assert colours[new] in PALETTE
        assert min(colour_distance(colours[new], c) for k, c in colours.items() if k != new) >= 0.8 * closest_shipped
        assert luminance(colours[new]) <= MAX_LUMINANCE  # no pale shade such as the lavender "#c5b0d5"
    assert method_colours([{"key": k} for k in keys]) == colours  # the same table, the same colours
    assert method_colours([{"key": "bfspo-k4", "color": "black"}])["bfspo-k4"] == "#000000"  # a config's colour wins


def test_contrasts_of_one_method_get_distinct_colours():
    """Issue 33: the breakdown's paired figure drew two contrasts of BFS-PO in the same red."""
    red = method_colour({"key": "bfspo"})
    colours = distinct_colours([method_colour({"key": "dapo"}), red, red, method_colour({"key": "bfspo-first"})])
    assert colours[:2] == ["#1f77b4", red] and colours[3] == method_colour({"key": "bfspo-first"})
    assert len(set(colours)) == 4 and min(colour_distance(colours[2], c) for c in colours[:2] + colours[3:]) > 100


@pytest.fixture
def drawn(monkeypatch):
    """Every figure `bfspo figures` saves, by stem: its axes' y labels, line data and colours."""
    seen = {}
    save = figures._save

    def record(fig, out_dir, stem):
        seen[stem] = [(ax.get_ylabel(), [(line.get_ydata(), line.get_color()) for line in ax.get_lines()])
                      for ax in fig.axes]
        return save(fig, out_dir, stem)

    monkeypatch.setattr(figures, "_save", record)
    return seen


def test_learning_curves_plot_accuracy_in_percent(tmp_path, drawn):
    """Issue 33: the curves plotted accuracy as a fraction (0-0.12) beside the tables' percent."""
    runs_dir = tmp_path / "runs"
    for run in ("m_ts_dapo_s0", "m_ts_bfspo_s0", "m_ts_bfspo_s1"):
        write_run(runs_dir, run, 3, [])
    assert main(["figures", "--spec", json.dumps(SPEC), "--summaries", *summaries(tmp_path), "--runs-dir",
                 str(runs_dir), "--out-dir", str(tmp_path / "fig")]) == 0
    (acc,) = [lines for label, lines in drawn["curves_m_ts"] if "accuracy" in label]
    assert [label for label, _ in drawn["curves_m_ts"] if "accuracy" in label] == ["accuracy of the first samples (%)"]
    values = [v for ydata, _ in acc for v in ydata]
    assert 50.0 < min(values) and max(values) < 54.0  # 0.51-0.53 in metrics.jsonl


def test_curves_are_ema_smoothed_per_seed():
    import pandas as pd

    frames = [pd.DataFrame({"step": [1, 2, 3], "x": [0.0, 1.0, 1.0]}), pd.DataFrame({"step": [1, 2], "x": [1.0, 1.0]})]
    raw, smooth = _seed_curves(frames, "x")
    assert raw.index.tolist() == [1, 2, 3] and raw[1].isna().tolist() == [False, False, True]
    a = EMA_ALPHA  # pandas' adjusted EMA: weights (1 - a)^i, normalised
    assert smooth.loc[2, 0] == pytest.approx((1.0 + (1 - a) * 0.0) / (1 + (1 - a)))
    assert smooth[1].dropna().tolist() == [1.0, 1.0]


def test_pareto_points_carry_the_tables_95_percent_interval():
    """One seed: the summary's interval over questions; several: the bootstrap over seeds (issue 26:
    the single-seed plot showed no uncertainty, its std being undefined)."""
    from bfspo.reporting.figures import interval_err
    from bfspo.reporting.summaries import Stat

    assert interval_err(Stat(60.0, float("nan"), 1, 56.0, 65.0)) == [[4.0], [5.0]]
    assert interval_err(Stat(60.0)) is None


def test_the_paired_step_time_axis_says_which_way_the_ratio_goes():
    """Issue 33: the axis read "ratio of median step times (x; > 1: faster)"."""
    label = figures.PAIRED_UNITS["step"]
    assert "(x;" not in label and "baseline's median step time / the arm's" in label and "the arm is faster" in label
