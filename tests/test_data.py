"""`bfspo prepare`: the seven splits from the real raw files, and every kind of bad input."""

import json
import re
import shutil
from pathlib import Path

import pytest

from bfspo.cli import main
from bfspo.io import read_jsonl
from bfspo.tasks.prepare import SPLITS
from bfspo.tasks.verify import is_correct

RAW = Path(__file__).resolve().parents[1] / "data" / "raw"
COUNTS = {"gsm8k_train": 7473, "math_train": 4500, "gsm8k": 1319, "math500": 500,
          "mmlu_stem": 3018, "aime25": 30, "minerva_math": 272}


def read(path):
    return [row for _, row in read_jsonl(path)]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared")
    assert main(["prepare", "--raw-dir", str(RAW), "--out-dir", str(out)]) == 0
    return out


def raw_copy(tmp_path, split, edit=None):
    """A raw folder holding only `split`'s file, with `edit(lines) -> lines` applied."""
    src = RAW / SPLITS[split].raw
    dst = tmp_path / "raw" / SPLITS[split].raw
    dst.parent.mkdir(parents=True)
    lines = src.read_text(encoding="utf-8").rstrip("\n").split("\n")
    dst.write_text("\n".join(edit(lines) if edit else lines) + "\n", encoding="utf-8")
    return tmp_path / "raw"


def replace_line(n, text):
    return lambda lines: [text if i == n - 1 else line for i, line in enumerate(lines)]


def prepare(raw, out, *splits, skip=False):
    return main(["prepare", "--raw-dir", str(raw), "--out-dir", str(out), "--splits", *splits]
                + (["--skip-malformed"] if skip else []))


# ------------------------------------------------------------------ the real data


def test_all_seven_splits_with_their_counts(prepared):
    assert sorted(p.name for p in prepared.glob("*.jsonl")) == sorted(f"{s}.jsonl" for s in COUNTS)
    for split, count in COUNTS.items():
        rows = read(prepared / f"{split}.jsonl")
        assert len(rows) == count
        assert len({r["id"] for r in rows}) == count
        assert all(r["benchmark"] == split and r["question"].strip() and r["answer"] for r in rows)
        assert list(rows[0])[:4] == ["id", "question", "answer", "benchmark"]
        report = json.loads((prepared / f"{split}.report.json").read_text())
        assert report == {"split": split, "raw": str(RAW / SPLITS[split].raw), "rows": count, "expected": count,
                          "count_ok": True, "skipped": 0, "malformed": []}


def test_gsm8k_answer_is_the_number_after_hashes_without_commas(prepared):
    test = read(prepared / "gsm8k.jsonl")
    assert test[0]["answer"] == "18" and test[0]["solution"].endswith("#### 18")
    assert test[2]["answer"] == "70000"
    train = read(prepared / "gsm8k_train.jsonl")
    with_commas = [r for r in train if "," in r["solution"].rsplit("####", 1)[1]]
    assert with_commas and all("," not in r["answer"] for r in with_commas)
    assert {r["answer"] for r in with_commas} >= {"1080", "109200000"}


def test_math_answers_come_from_the_field_or_the_last_box(prepared):
    math500 = read(prepared / "math500.jsonl")
    assert math500[0]["answer"] == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert math500[0]["unique_id"] == "test/precalculus/807.json" and math500[0]["level"] == 2
    train = read(prepared / "math_train.jsonl")
    assert [r["answer"] for r in train[:4]] == ["2", "10", "\\dfrac{9}{7}", "i"]
    assert train[0]["idx"] == 0 and train[0]["type"] == "Algebra"
    minerva = read(prepared / "minerva_math.jsonl")
    assert [r["answer"] for r in minerva[:3]] == ["1.6", "4.5e33", "41.8"]


def test_aime_answers_are_integers(prepared):
    rows = read(prepared / "aime25.jsonl")
    assert rows[0]["answer"] == "70" and rows[0]["source_id"] == "0"
    assert all(r["answer"].isdigit() for r in rows)


def test_mmlu_question_carries_lettered_choices_and_the_answer_is_a_letter(prepared):
    rows = read(prepared / "mmlu_stem.jsonl")
    first = rows[0]
    assert first["question"].splitlines()[1:] == [
        "A. maintain the population at a point corresponding to the midpoint of its logistic curve",
        "B. opt for zero population control once the K value of the curve has been reached",
        "C. reduce the carrying capacity cif the environment to lower the K value",
        "D. increase the mortality rate",
    ]
    assert first["answer"] == "C" and first["answer_index"] == 2 and first["subject"] == "college_biology"
    assert {r["answer"] for r in rows} == set("ABCD")


@pytest.mark.parametrize("split", ["gsm8k", "math500", "mmlu_stem", "aime25", "minerva_math"])
def test_every_gold_answer_verifies_against_itself(prepared, split):
    rows = read(prepared / f"{split}.jsonl")
    assert all(is_correct(split, f"The answer is \\boxed{{{r['answer']}}}.", r["answer"]) for r in rows)


def test_selected_splits_only(tmp_path):
    assert prepare(RAW, tmp_path, "aime25", "math500") == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "aime25.jsonl", "aime25.report.json", "math500.jsonl", "math500.report.json"]


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "split, line, text, problem",
    [
        ("aime25", 5, '{"id": "4", "question": "Find N.", "answer": ', "not valid JSON"),
        ("aime25", 5, '["not", "an", "object"]', "expected a JSON object, got list"),
        ("aime25", 5, '{"id": "4", "question": "Find N.", "answer": 70.5}', "answer is not an integer"),
        ("aime25", 5, '{"id": "4", "answer": 70}', "missing field 'question'"),
        ("gsm8k", 7, '{"question": "How many?", "answer": "3 + 4 = 7"}', "no '####' final answer"),
        ("gsm8k", 7, '{"question": "How many?", "answer": "#### seven"}', "not a number"),
        ("gsm8k", 7, '{"question": "", "answer": "#### 7"}', "field 'question' is empty"),
        ("minerva_math", 3, '{"problem": "Compute x.", "solution": "x is 4."}', "no \\\\boxed\\{\\} answer"),
        ("math_train", 9, '{"problem": "Compute x.", "solution": "x = \\\\boxed{4"}', "no \\\\boxed\\{\\} answer"),
        ("mmlu_stem", 2, '{"question": "Q?", "choices": ["a", "b", "c"], "answer": 0}', "expected 4 string choices"),
        ("mmlu_stem", 2, '{"question": "Q?", "choices": ["a", "b", "c", "d"], "answer": 4}', "answer index 4"),
        ("mmlu_stem", 2, '{"question": "Q?", "choices": ["a", "b", "c", "d"], "answer": "B"}', "field 'answer'"),
    ],
)
def test_malformed_row_names_file_and_line_and_writes_nothing(tmp_path, capsys, split, line, text, problem):
    raw = raw_copy(tmp_path, split, replace_line(line, text))
    out = tmp_path / "out"
    assert prepare(raw, out, split) == 2
    err = capsys.readouterr().err
    assert f"{raw / SPLITS[split].raw}:{line}:" in err
    assert re.search(problem, err)
    assert not out.exists() or not any(out.iterdir())


def test_skip_malformed_skips_counts_and_reports(tmp_path, capsys):
    raw = raw_copy(tmp_path, "aime25", lambda lines: replace_line(5, "{oops")(replace_line(9, '{"question": "Q"}')(lines)))
    out = tmp_path / "out"
    assert prepare(raw, out, "aime25", skip=True) == 0
    printed = capsys.readouterr().out
    assert "aime25: 28 rows (expected 30)" in printed
    assert "skipped 2 malformed rows" in printed and "lines 5, 9" in printed
    rows = read(out / "aime25.jsonl")
    assert len(rows) == 28 and "aime25-4" not in {r["id"] for r in rows} and rows[4]["id"] == "aime25-5"
    report = json.loads((out / "aime25.report.json").read_text())
    assert report["rows"] == 28 and report["skipped"] == 2 and report["count_ok"] is False
    assert [m["line"] for m in report["malformed"]] == [5, 9]
    assert "not valid JSON" in report["malformed"][0]["problem"]
    assert "missing field 'answer'" in report["malformed"][1]["problem"]


def test_count_mismatch_is_an_error_unless_skipping(tmp_path, capsys):
    raw = raw_copy(tmp_path, "aime25", lambda lines: lines[:-1])
    out = tmp_path / "out"
    assert prepare(raw, out, "aime25") == 2
    assert "29 rows, but split 'aime25' has 30" in capsys.readouterr().err
    assert not out.exists()
    assert prepare(raw, out, "aime25", skip=True) == 0
    assert "aime25: 29 rows (expected 30)" in capsys.readouterr().out
    assert json.loads((out / "aime25.report.json").read_text())["count_ok"] is False


def test_an_error_in_any_split_leaves_no_output_at_all(tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(RAW, raw)
    path = raw / SPLITS["minerva_math"].raw
    lines = path.read_text(encoding="utf-8").rstrip("\n").split("\n")
    path.write_text("\n".join(lines[:-1] + ["{broken"]) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    assert main(["prepare", "--raw-dir", str(raw), "--out-dir", str(out)]) == 2
    assert not out.exists()


def test_missing_raw_file_is_a_clear_error(tmp_path, capsys):
    assert prepare(tmp_path, tmp_path / "out", "gsm8k") == 2
    assert "raw file for split 'gsm8k' not found" in capsys.readouterr().err


def test_unknown_split_is_rejected(tmp_path):
    with pytest.raises(SystemExit) as exc:
        prepare(RAW, tmp_path, "gsm9k")
    assert exc.value.code == 2
