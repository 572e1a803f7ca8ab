"""`bfspo toy forms`: the verbosity of toy answers, worked by hand on generated solutions."""

import random

import pytest

from bfspo.cli import main
from bfspo.io import write_jsonl
from bfspo.toy.report import verbosity_report
from bfspo.toy.task import make_problem, solution


def samples():
    """Three answers to one 3-step problem: all concise (3 steps + answer: 4 lines), all verbose
    (opening, 3 steps, recap, answer: 6 lines), and a mix whose opening and recap are absent
    (concise) with lines verbose, concise, verbose, stepwise: 2 verbose lines of 4."""
    p = make_problem(random.Random(0), "apples", 3)
    mixed = ("concise", "verbose", "concise", "verbose", "concise", "stepwise")  # opening, 3 steps, recap, answer
    return [
        {"response": solution(p, "concise"), "correct": True, "num_tokens": 40},
        {"response": solution(p, "verbose"), "correct": False, "num_tokens": 100},
        {"response": solution(p, mixed), "correct": True, "num_tokens": 60},
    ]


def test_shares_and_bins_by_hand():
    r = verbosity_report(samples())
    assert r["answers"] == 3 and r["accuracy"] == pytest.approx(200 / 3) and r["avg_length"] == pytest.approx(200 / 3)
    assert r["line_share"] == pytest.approx({"concise": 5 / 14, "stepwise": 1 / 14, "verbose": 8 / 14})
    bins = r["by_verbose_share"]
    assert bins == {"< 1/3": {"answers": 1, "accuracy": 100, "avg_length": 40},
                    "1/3-2/3": {"answers": 1, "accuracy": 100, "avg_length": 60},
                    "> 2/3": {"answers": 1, "accuracy": 0, "avg_length": 100}}
    assert verbosity_report(samples()[:1])["by_verbose_share"]["> 2/3"] == {"answers": 0, "accuracy": None,
                                                                            "avg_length": None}


def test_cli_reports_and_rejects_bad_input(tmp_path, capsys):
    write_jsonl(tmp_path / "ev" / "samples.jsonl", samples())
    assert main(["toy", "forms", str(tmp_path / "ev")]) == 0
    out = capsys.readouterr().out
    assert "3 answers, accuracy 66.7%, 66.7 tokens; lines: concise 36%, stepwise 7%, verbose 57%" in out
    assert main(["toy", "forms", str(tmp_path / "missing")]) == 2
    assert "no samples.jsonl" in capsys.readouterr().err
    write_jsonl(tmp_path / "bad" / "samples.jsonl", [{"response": "x"}])
    assert main(["toy", "forms", str(tmp_path / "bad")]) == 2
    assert "samples.jsonl:1: a sample needs response, correct and num_tokens" in capsys.readouterr().err
