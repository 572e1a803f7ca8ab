"""The toy task: reproducible problems, correct solutions in every mix of forms, disjoint splits."""

import random
import statistics

import pytest

from bfspo.cli import main
from bfspo.io import read_jsonl
from bfspo.tasks.verify import is_correct
from bfspo.toy.model import train_tokenizer
from bfspo.toy.sft import tokenizer_corpus
from bfspo.toy.task import (
    ADD_SUB,
    DAYS,
    DEFAULT,
    FORM_WEIGHTS,
    FORMS,
    ID_STEPS,
    ID_TEMPLATES,
    MAX_VALUE,
    OOD_STEPS,
    OOD_TEMPLATES,
    Difficulty,
    line_forms,
    make_problem,
    make_splits,
    random_forms,
    solution,
)

APPLY = {"add": lambda a, n: a + n, "sub": lambda a, n: a - n, "mul": lambda a, n: a * n, "div": lambda a, n: a / n}


@pytest.fixture(scope="module")
def splits():
    return make_splits(seed=7, n_train=300, n_rl=100, n_eval=60)


def test_same_seed_same_data_and_other_seed_other_data(splits):
    assert make_splits(seed=7, n_train=300, n_rl=100, n_eval=60) == splits
    assert make_splits(seed=8, n_train=300, n_rl=100, n_eval=60)["toy"] != splits["toy"]


def test_eval_splits_do_not_depend_on_training_sizes(splits):
    other = make_splits(seed=7, n_train=10, n_rl=5, n_eval=60)
    assert other["toy"] == splits["toy"] and other["toy_ood"] == splits["toy_ood"]


def test_split_sizes_schema_and_disjoint_questions(splits):
    sizes = {"train": 300, "rl_train": 100, "toy": 60, "toy_ood": 60}
    questions = []
    for name, rows in splits.items():
        assert len(rows) == sizes[name]
        assert len({r["id"] for r in rows}) == len(rows)
        for r in rows:
            assert r["benchmark"] == ("toy_ood" if name == "toy_ood" else "toy")
            assert isinstance(r["answer"], str) and 1 <= int(r["answer"]) <= MAX_VALUE
            assert ("solution" in r) == (name == "train")
        questions += [r["question"] for r in rows]
    assert len(set(questions)) == len(questions)


def test_in_domain_and_out_of_domain_differ_as_specified(splits):
    for name in ("train", "rl_train", "toy"):
        assert {r["template"] for r in splits[name]} == set(ID_TEMPLATES)
        assert {r["steps"] for r in splits[name]} == set(range(ID_STEPS[0], ID_STEPS[1] + 1))
    ood = splits["toy_ood"]
    unseen = [r for r in ood if r["template"] in OOD_TEMPLATES]
    longer = [r for r in ood if r["template"] in ID_TEMPLATES]
    assert len(unseen) == len(longer) == len(ood) // 2
    assert {r["steps"] for r in unseen} <= set(range(ID_STEPS[0], ID_STEPS[1] + 1))
    assert {r["steps"] for r in longer} == set(range(OOD_STEPS[0], OOD_STEPS[1] + 1))


def test_the_default_difficulty_is_the_toy_of_the_readme():
    assert DEFAULT == Difficulty(MAX_VALUE, ADD_SUB[1]) and DEFAULT.start == (2, 15)
    assert make_splits(7, 30, 10, 20, Difficulty()) == make_splits(7, 30, 10, 20)


def test_a_harder_difficulty_reaches_larger_numbers_within_its_bounds():
    hard = Difficulty(max_value=30, max_operand=15)
    rng = random.Random(0)
    problems = [make_problem(rng, "apples", 5, hard) for _ in range(300)]
    values = [s.after for p in problems for s in p.steps] + [p.start for p in problems]
    operands = [s.operand for p in problems for s in p.steps if s.op in ("add", "sub")]
    assert min(values) >= 1 and max(values) == 30 and max(p.start for p in problems) <= 22
    assert min(operands) == ADD_SUB[0] and max(operands) == 15
    assert max(int(r["answer"]) for r in make_splits(0, 10, 300, 10, hard)["rl_train"]) > MAX_VALUE


@pytest.mark.parametrize("bad", [dict(max_value=30, max_operand=1), dict(max_value=4, max_operand=9)])
def test_a_difficulty_without_room_for_a_step_is_refused(bad):
    with pytest.raises(ValueError, match="max_operand"):
        Difficulty(**bad)


@pytest.mark.parametrize("template", ID_TEMPLATES + OOD_TEMPLATES)
def test_every_step_is_exact_small_arithmetic_stated_in_the_question(template):
    rng = random.Random(template)
    for _ in range(50):
        p = make_problem(rng, template, 7)
        value = p.start
        assert p.question.startswith(p.start_sentence) and f" {p.start} " in p.start_sentence
        for s in p.steps:
            assert s.before == value and s.after == APPLY[s.op](s.before, s.operand)
            assert 1 <= s.after <= MAX_VALUE
            if s.op in ("add", "sub"):
                assert ADD_SUB[0] <= s.operand <= ADD_SUB[1] and f" {s.operand} " in f" {s.sentence} "
            else:
                assert s.operand == 2 and ("double" if s.op == "mul" else "half") in s.sentence
            assert s.sentence in p.question
            value = s.after
        assert p.answer == value


def expected_line_forms(forms):
    """The form of each line a solution with these part forms has: the opening and the recap
    exist only in the verbose form."""
    opening, *steps, recap, answer = forms
    return ["verbose"] * (opening == "verbose") + steps + ["verbose"] * (recap == "verbose") + [answer]


def test_steps_fall_on_consecutive_days_from_monday_named_in_every_form():
    p = make_problem(random.Random(3), "hotel", 7)
    assert [s.day for s in p.steps] == list(DAYS)
    for form in FORMS:
        lines = solution(p, form).splitlines()
        offset = 1 if form == "verbose" else 0  # the verbose opening restates the start first
        for s, line in zip(p.steps, lines[offset:]):
            assert s.day in line and f"= {s.after}" in line


def test_every_mix_of_forms_is_verified_correct_and_a_wrong_answer_is_not(splits):
    rng = random.Random(0)
    for _ in range(40):
        p = make_problem(rng, rng.choice(ID_TEMPLATES + OOD_TEMPLATES), rng.randint(2, 7))
        for forms in (*FORMS, random_forms(rng, len(p.steps))):
            text = solution(p, forms)
            assert text.endswith(f"\\boxed{{{p.answer}}}") or text.endswith(f"\\boxed{{{p.answer}}}.")
            assert is_correct("toy", text, str(p.answer))
            wrong = text.replace(f"\\boxed{{{p.answer}}}", f"\\boxed{{{p.answer + 1}}}")
            assert not is_correct("toy", wrong, str(p.answer))
            full = (forms,) * (len(p.steps) + 3) if isinstance(forms, str) else forms
            assert line_forms(text) == expected_line_forms(full)
    for r in splits["train"][:100]:
        assert is_correct("toy", r["solution"], r["answer"])
        assert len(r["forms"]) == r["steps"] + 3
        assert line_forms(r["solution"]) == expected_line_forms(r["forms"])


def test_solution_rejects_a_wrong_number_of_forms_or_an_unknown_form():
    p = make_problem(random.Random(0), "apples", 3)
    with pytest.raises(ValueError, match="need 6 forms"):
        solution(p, ("concise",) * 5)
    with pytest.raises(ValueError, match="need 6 forms"):
        solution(p, "terse")


def test_training_mixes_forms_within_solutions(splits):
    parts = [f for r in splits["train"] for f in r["forms"]]
    for form in FORMS:
        share = parts.count(form) / len(parts)
        assert abs(share - FORM_WEIGHTS[form]) < 0.05, (form, share)
    mixed = [r for r in splits["train"] if len(set(r["forms"])) > 1]
    assert len(mixed) > 0.9 * len(splits["train"])


def test_forms_differ_in_length_and_fit_the_toy_budget(splits):
    tok = train_tokenizer(tokenizer_corpus(splits["train"]), 544)
    lengths = {f: [] for f in (*FORMS, "mixed")}
    rng = random.Random(1)
    for _ in range(120):
        p = make_problem(rng, rng.choice(ID_TEMPLATES), rng.randint(*ID_STEPS))
        n = {f: len(tok(solution(p, f))["input_ids"]) + 1 for f in FORMS}  # + EOS
        n["mixed"] = len(tok(solution(p, random_forms(rng, len(p.steps))))["input_ids"]) + 1
        assert n["concise"] < n["stepwise"] < n["verbose"]
        assert n["concise"] <= n["mixed"] <= n["verbose"]
        for f, v in n.items():
            lengths[f].append(v)
    means = {f: statistics.mean(v) for f, v in lengths.items()}
    assert means["verbose"] > 2 * means["concise"] and means["stepwise"] > 1.15 * means["concise"], means
    assert statistics.pstdev(lengths["mixed"]) > 0.2 * means["mixed"]
    # The toy's budget is 160 (config/README.md): no answer is cut off, while the overlong penalty
    # (from 0.6 * 160 = 96 tokens) reaches most all-verbose answers and no all-concise one.
    assert max(lengths["verbose"]) < 160
    assert statistics.mean(v > 0.6 * 160 for v in lengths["verbose"]) > 0.5
    assert max(lengths["concise"]) <= 0.6 * 160


def test_cli_writes_the_four_files_reproducibly(tmp_path):
    args = ["toy", "data", "--seed", "3", "--n-train", "50", "--n-rl", "20", "--n-eval", "10"]
    assert main([*args, "--out-dir", str(tmp_path / "a")]) == 0
    assert main([*args, "--out-dir", str(tmp_path / "b")]) == 0
    for name, n in (("train", 50), ("rl_train", 20), ("toy", 10), ("toy_ood", 10)):
        a, b = tmp_path / "a" / f"{name}.jsonl", tmp_path / "b" / f"{name}.jsonl"
        assert a.read_bytes() == b.read_bytes()
        assert len(list(read_jsonl(a))) == n


def test_cli_rejects_empty_splits(tmp_path, capsys):
    assert main(["toy", "data", "--out-dir", str(tmp_path), "--n-eval", "0"]) == 2
    assert "--n-eval" in capsys.readouterr().err


def test_cli_difficulty_flags_reach_the_generator_and_bad_ones_are_named(tmp_path, capsys):
    args = ["toy", "data", "--n-train", "5", "--n-rl", "200", "--n-eval", "5", "--max-value", "30"]
    assert main([*args, "--max-operand", "15", "--out-dir", str(tmp_path / "hard")]) == 0
    answers = [int(r["answer"]) for _, r in read_jsonl(tmp_path / "hard" / "rl_train.jsonl")]
    assert max(answers) > MAX_VALUE and max(answers) <= 30
    assert main([*args, "--max-operand", "1", "--out-dir", str(tmp_path / "bad")]) == 2
    assert "--max-value/--max-operand/--min-steps/--max-steps" in capsys.readouterr().err
