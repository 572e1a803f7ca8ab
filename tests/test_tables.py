"""`bfspo tables`: our rows (mean ± std over seeds, AES against our zero-shot) beside the paper's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from bfspo.cli import main
from bfspo.reporting.summaries import Stat, load_reported, load_summaries
from bfspo.reporting.tables import _flat, build_rows, build_table, fmt

REPORTED_HEADER = "table,model,train_set,benchmark,domain,method,K,ratio,acc,avg_len,aes\n"
SPEC = {
    "name": "abl",
    "title": "Ablation on T_b",
    "layout": "ablation",
    "models": [{"key": "m", "label": "Model-1B"}],
    "methods": [
        {"key": "dapo", "label": "DAPO", "paper": "dapo", "k": 0, "selection": "bfs", "advantage": "branch", "overlong": True},
        {"key": "glob", "label": "Global Adv.", "paper": "bfspo-global-adv", "k": 3, "selection": "bfs",
         "advantage": "global", "overlong": True},
    ],
    "columns": [{"train_set": "ts", "benchmark": "b", "label": "B"}],
    "paper_tables": ["ablation"],
    "reported": None,
}


def summary(tmp_path: Path, run: str, method: str, acc: float, length: float, seed=0, benchmark="b", model="m") -> str:
    meta = {"run": run, "model": model, "method": method, "seed": str(seed)}
    if method != "zero-shot":
        meta["train_set"] = "ts"
    path = tmp_path / "eval" / run / benchmark / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": benchmark, "accuracy": acc, "avg_length": length, "meta": meta}))
    return str(path)


@pytest.fixture
def runs(tmp_path):
    """Zero-shot 80% / 200 tokens; DAPO over two seeds; the global-advantage variant over one."""
    return [
        summary(tmp_path, "m_zero-shot", "zero-shot", 80.0, 200.0),
        summary(tmp_path, "m_ts_dapo_s0", "dapo", 82.0, 180.0, seed=0),
        summary(tmp_path, "m_ts_dapo_s1", "dapo", 84.0, 170.0, seed=1),
        summary(tmp_path, "m_ts_glob_s0", "glob", 76.0, 160.0),
    ]


@pytest.fixture
def reported(tmp_path):
    path = tmp_path / "reported.csv"
    path.write_text(
        REPORTED_HEADER
        + "ablation,Model-1B,ts,b,in,zero-shot,,,81.0,210,0.0\n"
        + "ablation,Model-1B,ts,b,in,dapo,0,,83.0,190,0.12\n"
        + "ablation,Model-1B,ts,b,in,bfspo-global-adv,3,,85.0,150,0.45\n"
        + "ablation,Other-7B,ts,b,in,dapo,0,,99.0,10,9.9\n"
        + "main,Model-1B,ts,b,in,sft,,,79.5,205,-0.05\n"
        + "ratios,Model-1B,ts,b,in,tokenskip,,0.9,78.0,150,0.1\n"
        + "ratios,Model-1B,ts,b,in,tokenskip,,0.5,70.0,100,-0.2\n"
    )
    return str(path)


def build(tmp_path, spec, runs, reported=None) -> pd.DataFrame:
    """Run `bfspo tables build`; the formatted table, as the MD and TeX files show it."""
    args = ["tables", "build", "--spec", json.dumps(spec), "--summaries", *runs, "--out-dir", str(tmp_path / "out")]
    assert main(args + (["--reported", reported] if reported else [])) == 0
    return _flat(build_table(spec, build_rows(spec, load_summaries(runs), load_reported(reported))))


def test_fmt():
    assert fmt(Stat(85.64, 0.0, 1), 1) == "85.6"
    assert fmt(Stat(85.64, 0.44, 3), 1) == "85.6 ± 0.4"
    assert fmt(Stat(290.4, 4.2, 2), 0) == "290 ± 4"
    assert fmt(Stat(float("nan"), 0.0, 1), 2) == "-" and fmt(None) == "-"
    assert fmt(Stat(-0.001, 0.0, 1), 2) == "0.00" and fmt(Stat(0.5, -0.004, 2), 2) == "0.50 ± 0.00"
    assert fmt(Stat(82.0, 0.0, 1, 79.06, 84.8), 1) == "82.0 [79.1, 84.8]"


def test_csv_holds_numbers_with_intervals_and_seed_counts(tmp_path, runs, reported):
    single = json.loads(Path(runs[3]).read_text()) | {"accuracy_ci": [70.0, 82.0], "avg_length_ci": [150.0, 171.0]}
    Path(runs[3]).write_text(json.dumps(single))
    df = build(tmp_path, SPEC, runs, reported)
    assert df[df.Method == "Global Adv."].iloc[0]["Acc."] == "76.0 [70.0, 82.0]"
    csv = pd.read_csv(tmp_path / "out" / "abl.csv")
    assert list(csv.columns) == ["Method", "K", "Branch Adv.", "Len. Penalty", "Source", "method_key", "train_set",
                                 "benchmark", "metric", "mean", "std", "ci_low", "ci_high", "n_seeds", "runs"]
    # issue 26: the method's key and the runs behind a cell join a row to its W&B runs
    ours = csv[csv.Source == "ours"].drop_duplicates("Method").set_index("Method")
    assert ours.loc["DAPO", "method_key"] == "dapo" and ours.loc["DAPO", "runs"] == "m_ts_dapo_s0;m_ts_dapo_s1"
    assert ours.loc["Zero-shot", "runs"] == "m_zero-shot" and ours.loc["Global Adv.", "runs"] == "m_ts_glob_s0"
    assert set(csv[csv.Source == "paper"].method_key) == {"zero-shot", "dapo", "glob"}
    dapo = csv[(csv.Method == "DAPO") & (csv.Source == "ours")].set_index("metric")
    assert dapo.loc["acc", "mean"] == 83.0 and dapo.loc["acc", "std"] == pytest.approx(2 ** 0.5)
    assert dapo.loc["acc", "n_seeds"] == 2 and 82.0 <= dapo.loc["acc", "ci_low"] <= dapo.loc["acc", "ci_high"] <= 84.0
    glob = csv[(csv.Method == "Global Adv.") & (csv.Source == "ours")].set_index("metric")
    assert (glob.loc["acc", "ci_low"], glob.loc["avg_len", "ci_high"], glob.loc["acc", "n_seeds"]) == (70.0, 171.0, 1)
    assert pd.isna(glob.loc["acc", "std"])  # no spread over one seed
    assert glob.loc["aes", "mean"] == pytest.approx(-0.05) and pd.isna(glob.loc["aes", "ci_low"])
    paper = csv[(csv.Method == "DAPO") & (csv.Source == "paper")].set_index("metric")
    assert paper.loc["acc", "mean"] == 83.0 and pd.isna(paper.loc["acc", "n_seeds"])
    assert "-0.00" not in (tmp_path / "out" / "abl.md").read_text()


def test_aes_against_our_zero_shot_with_mean_and_std_over_seeds(tmp_path, runs):
    df = build(tmp_path, SPEC, runs)
    assert list(df.columns) == ["Method", "K", "Branch Adv.", "Len. Penalty", "Acc.", "Avg. Len.", "AES", "Source"]
    zero, dapo, glob = df.to_dict("records")
    assert zero == {"Method": "Zero-shot", "K": "-", "Branch Adv.": "-", "Len. Penalty": "-", "Acc.": "80.0",
                    "Avg. Len.": "200", "AES": "0.00", "Source": "ours"}
    # Seed 0: dLen = 20/200 = 0.10, dAcc = 2/80 -> +3 * 0.025 = 0.075, AES 0.175.
    # Seed 1: dLen = 30/200 = 0.15, dAcc = 4/80 -> +3 * 0.05 = 0.15, AES 0.30. Mean 0.2375, std 0.088.
    assert (dapo["Acc."], dapo["Avg. Len."], dapo["AES"]) == ("83.0 ± 1.4", "175 ± 7", "0.24 ± 0.09")
    assert (dapo["K"], dapo["Branch Adv."], dapo["Len. Penalty"], dapo["Source"]) == ("0", "-", "✓", "ours (2 seeds)")
    # dLen = 40/200 = 0.2, dAcc = -4/80 -> -5 * 0.05 = -0.25: AES -0.05 (the gamma branch).
    assert (glob["Acc."], glob["Avg. Len."], glob["AES"], glob["Branch Adv."]) == ("76.0", "160", "-0.05", "✗")


def test_each_of_our_rows_sits_above_the_papers_row(tmp_path, runs, reported):
    df = build(tmp_path, SPEC, runs, reported)
    assert list(zip(df["Method"], df["Source"])) == [
        ("Zero-shot", "ours"), ("Zero-shot", "paper"),
        ("DAPO", "ours (2 seeds)"), ("DAPO", "paper"),
        ("Global Adv.", "ours"), ("Global Adv.", "paper"),
    ]
    paper_dapo = df.iloc[3]
    # The paper's own numbers, as printed (not recomputed against our zero-shot), and the right model.
    assert (paper_dapo["Acc."], paper_dapo["Avg. Len."], paper_dapo["AES"]) == ("83.0", "190", "0.12")
    assert df.iloc[5]["AES"] == "0.45"


def test_reported_only_rows_are_marked_reported(tmp_path, runs, reported):
    spec = dict(SPEC, name="main", layout="models", methods=SPEC["methods"][:1], paper_tables=["ablation"],
                reported={"table": "main", "methods": {"sft": "SFT"}})
    df = build(tmp_path, spec, runs, reported)
    assert list(df.columns[:2]) == ["Model", "Method"]
    assert list(zip(df["Method"], df["Source"])) == [
        ("Zero-shot", "ours"), ("Zero-shot", "paper"), ("SFT", "reported"), ("DAPO", "ours (2 seeds)"), ("DAPO", "paper")
    ]
    assert df.iloc[2][["Acc.", "Avg. Len.", "AES"]].tolist() == ["79.5", "205", "-0.05"]
    assert set(df["Model"]) == {"Model-1B"}


def test_ratio_layout_lists_every_reported_ratio(tmp_path, runs, reported):
    spec = dict(SPEC, name="ratios", layout="ratios", methods=SPEC["methods"][:1],
                reported={"table": "ratios", "methods": {"tokenskip": "TokenSkip"}})
    df = build(tmp_path, spec, runs, reported)
    rows = df[df.Source == "reported"]
    assert rows[["Method", "Ratio", "Acc.", "AES"]].values.tolist() == [
        ["TokenSkip", "0.9", "78.0", "0.10"], ["TokenSkip", "0.5", "70.0", "-0.20"]]
    assert df[df.Source.str.startswith("ours")]["Ratio"].tolist() == ["-", "-"]


def test_several_columns_get_grouped_headers_in_the_paper_order(tmp_path, runs):
    ood = [summary(tmp_path, "m_zero-shot", "zero-shot", 50.0, 300.0, benchmark="o"),
           summary(tmp_path, "m_ts_dapo_s0", "dapo", 55.0, 300.0, benchmark="o")]
    spec = dict(SPEC, columns=[{"train_set": "ts", "benchmark": "b", "label": "B", "domain": "in"},
                               {"train_set": "ts", "benchmark": "o", "label": "O", "domain": "out"}])
    df = build(tmp_path, spec, runs + ood)
    assert list(df.columns[4:10]) == ["B (in-domain) Acc.", "B (in-domain) Avg. Len.", "B (in-domain) AES",
                                      "O (out-of-domain) Acc.", "O (out-of-domain) Avg. Len.", "O (out-of-domain) AES"]
    dapo = df[df.Method == "DAPO"].iloc[0]
    # One seed out-of-domain: dLen 0, dAcc = 5/50 -> 3 * 0.1 = 0.30.
    assert dapo["O (out-of-domain) AES"] == "0.30" and dapo["O (out-of-domain) Acc."] == "55.0"
    tex = (tmp_path / "out" / "abl.tex").read_text()
    assert r"\multicolumn{3}{c}{B (in-domain)}" in tex and r"\multicolumn{3}{c}{O (out-of-domain)}" in tex


def test_markdown_and_latex(tmp_path, runs, reported):
    build(tmp_path, SPEC, runs, reported)
    md = (tmp_path / "out" / "abl.md").read_text()
    assert md.startswith("## Ablation on T_b") and "| DAPO" in md and "83.0 ± 1.4" in md and "reported =" in md
    assert "| 80.0 " in md and "| 0.00 " in md  # printed as formatted, not re-parsed as numbers
    tex = (tmp_path / "out" / "abl.tex").read_text()
    for token in (r"\toprule", r"\midrule", r"\bottomrule", r"\label{tab:abl}", r"83.0 $\pm$ 1.4", r"\checkmark",
                  r"$\times$", r"\caption{Ablation on T\_b}"):
        assert token in tex, token
    header = next(line for line in tex.splitlines() if line.startswith("Method"))
    assert header == r"Method & K & Branch Adv. & Len. Penalty & Acc. & Avg. Len. & AES & Source \\"


def test_bad_summaries_are_named(tmp_path, runs, capsys):
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"benchmark": "b", "accuracy": 1.0, "avg_length": 2.0, "meta": {"method": "dapo"}}))
    args = ["tables", "build", "--spec", json.dumps(SPEC), "--out-dir", str(tmp_path / "out"), "--summaries"]
    assert main(args + [*runs, str(broken)]) == 2
    assert "broken.json: summary lacks meta.model" in capsys.readouterr().err
    twice = summary(tmp_path / "again", "m_zero-shot", "zero-shot", 70.0, 100.0)
    assert main(args + [*runs, twice]) == 2
    assert "two zero-shot summaries" in capsys.readouterr().err


def test_consistency_report_lists_only_disagreeing_rows(tmp_path):
    reported = tmp_path / "reported.csv"
    # Against 80.0 / 200: 84.0 / 180 gives AES 0.10 + 3 * 0.05 = 0.25 (printed right); 82.0 / 150 gives
    # 0.25 + 3 * 0.025 = 0.325, printed 0.50 (wrong).
    reported.write_text(REPORTED_HEADER + "t,M,ts,b,in,zero-shot,,,80.0,200,0.0\n"
                        "t,M,ts,b,in,dapo,,,84.0,180,0.25\nt,M,ts,b,in,bfspo,,,82.0,150,0.50\n")
    assert main(["tables", "consistency", "--reported", str(reported), "--out-dir", str(tmp_path)]) == 0
    checked = pd.read_csv(tmp_path / "aes_consistency.csv")
    assert dict(zip(checked.method, checked.consistent)) == {"dapo": True, "bfspo": False}
    md = (tmp_path / "aes_consistency.md").read_text()
    assert "1 of 2 rows" in md and "| bfspo" in md and "| dapo" not in md


def test_notes_name_the_runs_whose_batches_came_out_short(tmp_path, runs):
    def metrics(run, rows):
        path = tmp_path / "runs" / run / "metrics.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text("".join(json.dumps({"step": i + 1, "rollout/chains": c, "rollout/chains_target": 64, "rollout/batch_full": f}) + "\n"
                                for i, (c, f) in enumerate(rows)))

    metrics("m_ts_dapo_s0", [(64, True), (56, False), (64, True), (48, False)])
    metrics("m_ts_dapo_s1", [(64, True), (64, True)])
    args = ["tables", "build", "--spec", json.dumps(SPEC), "--summaries", *runs, "--out-dir", str(tmp_path / "out")]
    assert main(args + ["--runs-dir", str(tmp_path / "runs")]) == 0
    md = (tmp_path / "out" / "abl.md").read_text()
    assert "Short batches: m_ts_dapo_s0: 2 of 4 steps trained on a short batch (fewest: 48 of 64 chains, step 4)." in md
    assert "m_ts_dapo_s1" not in md and "m_ts_glob_s0" not in md  # full batches; no metrics
    assert main(args) == 0
    assert "Short batches" not in (tmp_path / "out" / "abl.md").read_text()


def test_the_chains_check_fails_on_a_step_below_95_percent_of_its_target(tmp_path, capsys):
    """Issue 36's check of a finished `make toy`: `bfspo tables chains` passes runs whose every step
    trained >= 95% of its target chains (62 of 64), and names, with exit 1, a run with one that did not."""
    def metrics(run, chains):
        path = tmp_path / "runs" / run / "metrics.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text("".join(json.dumps({"step": i + 1, "rollout/chains": c, "rollout/chains_target": 64}) + "\n"
                                for i, c in enumerate(chains)) + json.dumps({"step": 2, "val-core/accuracy": 0.5}) + "\n")

    metrics("toy_toy_dapo_s0", [64, 62, 64])
    metrics("toy_toy_bfspo-k2_s0", [64, 64])
    assert main(["tables", "chains", "--runs-dir", str(tmp_path / "runs")]) == 0
    assert "2 runs under" in capsys.readouterr().out
    metrics("toy_toy_bfspo_s0", [64, 60, 48])
    assert main(["tables", "chains", "--runs-dir", str(tmp_path / "runs")]) == 1
    out = capsys.readouterr().out
    assert "toy_toy_bfspo_s0: 2 of 3 steps trained on a short batch (fewest: 48 of 64 chains, step 3)" in out
    assert "toy_toy_dapo_s0" not in out
    assert main(["tables", "chains", "--runs-dir", str(tmp_path / "none")]) == 1


def test_a_table_refuses_an_evaluation_of_another_base_model_or_adapter(tmp_path, runs, capsys):
    """Issue 31: an evaluation records the fingerprints of what it scored; a run records those of its
    base model (inputs.json) and published adapter (done.json). A table pairs them only when equal."""
    from bfspo.fingerprint import digest

    model, tokenizer = {"model.safetensors": "1" * 64}, {"tokenizer.json": "2" * 64}
    run_dir = tmp_path / "runs" / "m_ts_dapo_s0"
    run_dir.mkdir(parents=True)
    (run_dir / "inputs.json").write_text(json.dumps({"train_data": {"t.jsonl": "0" * 64}, "model": model,
                                                     "tokenizer": tokenizer}))
    (run_dir / "done.json").write_text(json.dumps({"adapter": "adapter", "adapter_sha256": "a" * 64}))
    scored = {"model": digest(model), "tokenizer": digest(tokenizer), "adapter": "a" * 64, "data": "d" * 64}

    def evaluated(prints):
        summary = json.loads(Path(runs[1]).read_text())
        Path(runs[1]).write_text(json.dumps(summary | {"settings": {"fingerprints": prints}}))

    args = ["tables", "build", "--spec", json.dumps(SPEC), "--summaries", *runs, "--out-dir", str(tmp_path / "out"),
            "--runs-dir", str(tmp_path / "runs")]
    evaluated(scored)
    assert main(args) == 0
    for part, named in (("model", "its model fingerprint"), ("adapter", "its adapter fingerprint")):
        evaluated(scored | {part: "f" * 64})  # a rebuilt base model / a run retrained since
        assert main(args) == 2
        err = capsys.readouterr().err
        assert f"{runs[1]}: {named}(s) differ from those run m_ts_dapo_s0 recorded" in err, err
        assert "Evaluate the run again" in err
    evaluated(None)  # an evaluation from before fingerprints cannot show it scored that run's model
    assert main(args) == 2 and "model and tokenizer and adapter fingerprint(s) differ" in capsys.readouterr().err


def test_the_footnote_names_the_forms_the_cells_use(tmp_path, runs):
    """Issue 33: with one seed a cell is `6.2 [0.0, 18.8]`, a 95% interval over the questions, but the
    footnote said "mean ± std over seeds"; it now names the forms the table's cells of ours use."""
    interval = {"accuracy_ci": [0.0, 18.8], "avg_length_ci": [150.0, 171.0]}
    one_seed = [r for r in runs if "_s1" not in r]
    for path in one_seed:
        Path(path).write_text(json.dumps(json.loads(Path(path).read_text()) | interval))
    build(tmp_path, SPEC, one_seed)
    md = (tmp_path / "out" / "abl.md").read_text()
    assert "[0.0, 18.8]" in md and "a [l, h]: one seed, its 95% interval over the questions" in md
    assert "over seeds" not in md
    build(tmp_path, SPEC, runs)  # DAPO over two seeds beside one-seed cells with intervals
    md = (tmp_path / "out" / "abl.md").read_text()
    assert "a ± s: mean ± std over seeds" in md and "one seed, its 95% interval over the questions" in md


def _chains_run(runs: Path, run: str, body: bytes | None) -> Path:
    path = runs / run / "metrics.jsonl"
    path.parent.mkdir(parents=True)
    if body is None:
        os.mkfifo(path)
    else:
        path.write_bytes(body)
    return path


GOOD_ROW = json.dumps({"step": 1, "rollout/chains": 64, "rollout/chains_target": 64}) + "\n"


@pytest.mark.parametrize("body, named", [
    (GOOD_ROW.encode() + b'{"step": 2, "rollout/cha', "metrics.jsonl:2: not valid JSON"),
    (GOOD_ROW.encode() + b'{"step": 2, "rollout/chains": 6\xff}\n', "metrics.jsonl:2: not UTF-8 text"),
    (GOOD_ROW.encode() + b'{"step": 2, "rollout/chains": NaN, "rollout/chains_target": 64}\n',
     "metrics.jsonl:2: rollout/chains nan and rollout/chains_target 64"),
    (GOOD_ROW.encode() + b'{"step": 2, "rollout/chains": "64", "rollout/chains_target": 64}\n',
     "metrics.jsonl:2: rollout/chains '64' and rollout/chains_target 64"),
    (GOOD_ROW.encode() + b'{"step": 2, "rollout/chains": 64, "rollout/chains_target": [64]}\n',
     "metrics.jsonl:2: rollout/chains 64 and rollout/chains_target [64]"),
    (GOOD_ROW.encode() + b'{"step": 2, "rollout/chains": 64}\n', "rollout/chains_target None"),
    (b"", "no step logs rollout/chains"),
    (None, "not a regular file"),
], ids=["torn", "not-utf8", "nan", "string", "list", "no-target", "empty", "fifo"])
def test_the_chains_check_fails_naming_a_run_whose_rows_it_cannot_read(tmp_path, capsys, body, named):
    """Issue 46: `bfspo tables chains` (make record-toy's check) passed runs whose rows it could not read,
    and a row of the wrong type was a traceback; now each is exit 1 naming the run and the problem."""
    runs = tmp_path / "runs"
    _chains_run(runs, "toy_toy_dapo_s0", GOOD_ROW.encode())
    _chains_run(runs, "toy_toy_bfspo_s0", body)
    assert main(["tables", "chains", "--runs-dir", str(runs)]) == 1
    out = capsys.readouterr().out
    assert "toy_toy_bfspo_s0: cannot check (" in out and named in out and "Traceback" not in out
    assert "toy_toy_dapo_s0" not in out


@pytest.mark.parametrize("share", ["nan", "-1", "0", "1.5", "most"])
def test_the_chains_check_refuses_a_share_outside_0_to_1(tmp_path, capsys, share):
    runs = tmp_path / "runs"
    _chains_run(runs, "toy_toy_dapo_s0", GOOD_ROW.encode())
    with pytest.raises(SystemExit) as stop:
        main(["tables", "chains", "--runs-dir", str(runs), "--share", share])
    assert stop.value.code == 2
    assert f"{share!r} is not a share in (0, 1]" in capsys.readouterr().err
    assert main(["tables", "chains", "--runs-dir", str(runs), "--share", "1"]) == 0


class Killed(BaseException):
    """What a kill does to the build, here: stop it between two steps."""


@pytest.mark.parametrize("renamed", [0, 1, 2])
def test_a_build_killed_between_its_files_leaves_a_marker_that_report_refuses(tmp_path, runs, monkeypatch, capsys,
                                                                              renamed):
    """Issue 46: a kill during a hand-run `bfspo tables build` left the new abl.csv beside the old .md and
    .tex. The three files are written as one unit: all to temporaries, then abl.incomplete, then the
    renames, then the marker removed; a kill between renames leaves the marker, `bfspo report` refuses
    the table, and the next build completes the set."""
    import bfspo.io as bio

    out = tmp_path / "out"
    build = ["tables", "build", "--spec", json.dumps(SPEC), "--out-dir", str(out), "--summaries"]
    assert main(build + runs[:2]) == 0
    old = {ext: (out / f"abl.{ext}").read_text() for ext in ("csv", "md", "tex")}
    real, done = os.replace, []

    def replace(src, dst):
        if Path(dst).parent == out and Path(dst).stem == "abl" and Path(dst).suffix != ".incomplete":
            if len(done) == renamed:
                raise Killed
            done.append(Path(dst).suffix[1:])
        real(src, dst)

    monkeypatch.setattr(bio.os, "replace", replace)
    with pytest.raises(Killed):
        main(build + runs)
    monkeypatch.setattr(bio.os, "replace", real)
    now = {ext: (out / f"abl.{ext}").read_text() for ext in ("csv", "md", "tex")}
    assert [ext for ext in now if now[ext] != old[ext]] == done  # a mix of new and old files ...
    assert (out / "abl.incomplete").exists()  # ... that says so
    assert sorted(p.name for p in out.iterdir()) == ["abl.csv", "abl.incomplete", "abl.md", "abl.tex"]
    report = ["report", "--project", "p", "--group", "abl", "--mode", "disabled", "--tables", str(out / "abl.csv"),
              "--wandb-dir", str(tmp_path / "wandb"), "--out", str(tmp_path / "report.json")]
    assert main(report) == 2
    assert f"{out / 'abl.csv'}: half-written (abl.incomplete is there" in capsys.readouterr().err
    assert main(build + runs) == 0
    assert not (out / "abl.incomplete").exists() and all((out / f"abl.{ext}").read_text() != old[ext] for ext in old)
    assert main(report) == 0


def test_branch_adv_follows_the_advantage_kind_not_its_name(monkeypatch):
    """Issue 45: a branch-style advantage variant (one advantage per segment, as Eq. 9) showed ✗ under
    Branch Adv. because its name is not `branch`; the mark comes from the registry's kind."""
    from bfspo.algorithm import advantages
    from bfspo.reporting.latex import NO, YES
    from bfspo.reporting.tables import _descriptors

    monkeypatch.setitem(advantages.ADVANTAGES, "branch-scaled", advantages.AdvantageKind(lambda t, e: None, per_chain=False))
    monkeypatch.setitem(advantages.ADVANTAGES, "leaf", advantages.AdvantageKind(lambda t, e: None, per_chain=True))
    model = {"label": "M"}

    def mark(advantage, k=3):
        return _descriptors("ablation", model, "x", {"k": k, "advantage": advantage, "overlong": True})[2]

    assert [mark("branch"), mark("branch-scaled"), mark("global"), mark("leaf"), mark("global", k=0)] == \
        [YES, YES, NO, NO, "-"]
