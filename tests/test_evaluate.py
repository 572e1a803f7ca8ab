"""`bfspo evaluate` end to end on CPU with the tiny model, and its bad-input cases."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from bfspo import fingerprint
from bfspo.cli import main
from bfspo.evaluation.evaluate import check_lengths, summarize
from bfspo.io import read_json, read_jsonl
from bfspo.tasks.prompts import prompt_ids
from bfspo.tasks.verify import extract_answer, is_correct
from tests.helpers import process

ROWS = [
    {"id": "gsm8k-0", "question": "Tom has 3 apples. He buys 4 more apples. How many apples does he have?",
     "answer": "7", "benchmark": "gsm8k"},
    {"id": "gsm8k-1", "question": "A shop sells 12 pens a day. How many pens does it sell in 5 days?",
     "answer": "60", "benchmark": "gsm8k"},
    {"id": "gsm8k-2", "question": "What is 2/3 of 12?", "answer": "8", "benchmark": "gsm8k"},
    {"id": "gsm8k-3", "question": "Ann has 10 pens and gives away 6. How many are left?", "answer": "4",
     "benchmark": "gsm8k"},
]


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def evaluate(model_dir, data, out_dir, *extra):
    return main(["evaluate", "--model", str(model_dir), "--benchmark", "gsm8k", "--data", str(data),
                 "--out-dir", str(out_dir), "--budget", "12", "--batch-size", "8", *extra])


def samples_of(out_dir):
    return [row for _, row in read_jsonl(out_dir / "samples.jsonl")]


def test_greedy_evaluation_writes_samples_and_summary(tiny_model_dir, tmp_path):
    data = write_rows(tmp_path / "gsm8k.jsonl", ROWS)
    assert evaluate(tiny_model_dir, data, tmp_path / "out", "--limit", "3", "--meta", "method=base", "k=0",
                    "--wandb-project", "bfspo-tests") == 0
    samples = samples_of(tmp_path / "out")
    summary = read_json(tmp_path / "out" / "summary.json")
    assert [s["id"] for s in samples] == ["gsm8k-0", "gsm8k-1", "gsm8k-2"]  # --limit 3, one greedy sample each
    assert all(s["sample"] == 0 for s in samples)
    for s, row in zip(samples, ROWS):
        assert s["gold"] == row["answer"]
        assert s["extracted"] == extract_answer("gsm8k", s["response"])
        assert s["correct"] == is_correct("gsm8k", s["response"], row["answer"])
        assert 1 <= s["num_tokens"] <= 12
        assert s["finished"] or s["num_tokens"] == 12
    assert summary["benchmark"] == "gsm8k" and summary["model"] == str(tiny_model_dir)
    assert summary["adapter"] is None
    assert summary["n_questions"] == 3 and summary["samples_per_question"] == 1
    assert summary["budget"] == 12 and summary["temperature"] == 0.0
    assert summary["meta"] == {"method": "base", "k": "0"}
    assert summary["accuracy"] == pytest.approx(100 * sum(s["correct"] for s in samples) / 3)
    assert summary["avg_length"] == pytest.approx(sum(s["num_tokens"] for s in samples) / 3)
    for key in ("accuracy", "avg_length"):
        lo, hi = summary[f"{key}_ci"]
        assert lo <= summary[key] <= hi


def test_cut_off_answers_are_scored_under_both_readings():
    """A response cut off by the budget counts as written in `accuracy` (TokenSkip's reading, the
    tables') and as wrong in `accuracy_cutoff_wrong` (training's reading)."""
    cut_text = "1. Read the question 2. Add the numbers 3. Check 4. Eliminate the"
    assert is_correct("gsm8k", cut_text, "4")  # as written: the list number is read as the answer
    samples = [{"correct": True, "finished": False, "num_tokens": 12},  # q0: the cut-off list
               {"correct": True, "finished": True, "num_tokens": 5},  # q1: right, finished
               {"correct": False, "finished": True, "num_tokens": 7},  # q2: two samples, one right but cut off
               {"correct": True, "finished": False, "num_tokens": 12}]
    per_q = summarize(samples[:2], 2)
    assert per_q["accuracy"] == 100.0 and per_q["accuracy_cutoff_wrong"] == 50.0
    two = summarize(samples, 2)
    assert two["accuracy"] == pytest.approx((100 + 50) / 2) and two["accuracy_cutoff_wrong"] == pytest.approx(25.0)
    lo, hi = two["accuracy_cutoff_wrong_ci"]
    assert lo <= 25.0 <= hi


def test_threads_sets_torchs_threads(tiny_model_dir, tmp_path, capsys):
    import torch

    data = write_rows(tmp_path / "gsm8k.jsonl", ROWS[:1])
    try:
        assert evaluate(tiny_model_dir, data, tmp_path / "out", "--threads", "2") == 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
    assert evaluate(tiny_model_dir, data, tmp_path / "bad", "--threads", "0") == 2
    assert "--threads must be positive" in capsys.readouterr().err


def test_sampled_evaluation_scores_the_mean_over_samples(tiny_model_dir, tmp_path):
    """Several samples at T=1 (the AIME protocol): a gold answer that one sample gives is scored."""
    data = write_rows(tmp_path / "gsm8k.jsonl", ROWS[:2])
    n = 8  # the tiny model ends most answers within a few tokens: enough samples that one holds a number
    args = ("--samples", str(n), "--temperature", "1.0", "--seed", "3")
    assert evaluate(tiny_model_dir, data, tmp_path / "first", *args) == 0
    first = samples_of(tmp_path / "first")
    assert [(s["id"], s["sample"]) for s in first] == [(r["id"], i) for r in ROWS[:2] for i in range(n)]
    # Any sample with an answer will do (the random model's outputs depend on its tokenizer).
    hit = next((s for s in first if s["extracted"] is not None), None)
    assert hit is not None, "no sampled response holds an answer to score"
    # Same seed, so the same responses: make that sample's answer the gold one and score again.
    rows = [dict(r, answer=hit["extracted"]) if r["id"] == hit["id"] else r for r in ROWS[:2]]
    assert evaluate(tiny_model_dir, write_rows(tmp_path / "gold.jsonl", rows), tmp_path / "second", *args) == 0
    second = samples_of(tmp_path / "second")
    assert [s["response"] for s in second] == [s["response"] for s in first]
    assert next(s for s in second if s["sample"] == hit["sample"] and s["id"] == hit["id"])["correct"]
    summary = read_json(tmp_path / "second" / "summary.json")
    per_question = [100 * sum(s["correct"] for s in second if s["id"] == r["id"]) / n for r in rows]
    assert summary["samples_per_question"] == n
    assert summary["accuracy"] == pytest.approx(sum(per_question) / 2) and summary["accuracy"] > 0


def test_evaluates_with_an_adapter(tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(base, lora).save_pretrained(str(tmp_path / "adapter"))
    data = write_rows(tmp_path / "gsm8k.jsonl", ROWS[:1])
    assert evaluate(tiny_model_dir, data, tmp_path / "out", "--adapter", str(tmp_path / "adapter")) == 0
    summary = read_json(tmp_path / "out" / "summary.json")
    assert summary["adapter"] == str(tmp_path / "adapter")
    # issue 31: what was scored, by content, to pair the adapter with the base model its run trained on
    model = fingerprint.model_inputs(str(tiny_model_dir))
    assert summary["settings"]["fingerprints"] == {
        "model": fingerprint.digest(model["model"]), "tokenizer": fingerprint.digest(model["tokenizer"]),
        "adapter": fingerprint.digest(fingerprint.folder_files(tmp_path / "adapter", "adapter")),
        "data": fingerprint.digest(fingerprint.read_data(data)[1])}


@pytest.mark.parametrize("case,message", [
    ("unknown_benchmark", "unknown benchmark 'gsm9k'"),
    ("missing_model", "no such model directory"),
    ("bad_json", "gsm8k.jsonl:2: not valid JSON"),
    ("missing_field", "gsm8k.jsonl:2: missing or empty field 'question'"),
    ("other_benchmark", "gsm8k.jsonl:1: row of benchmark 'math500'"),
    ("empty", "no questions"),
    ("long_prompt", "exceeds the model's 2048 positions"),
    ("greedy_samples", "would all be the same greedy response"),
    ("bad_meta", "--meta expects KEY=VALUE"),
])
def test_bad_input_exits_2_with_a_message_and_keeps_the_old_summary(tiny_model_dir, tmp_path, capsys, case, message):
    data = tmp_path / "gsm8k.jsonl"
    model, extra = tiny_model_dir, []
    lines = [json.dumps(r) for r in ROWS[:2]]
    if case == "unknown_benchmark":
        extra = ["--benchmark", "gsm9k"]
    elif case == "missing_model":
        model = tmp_path / "no_model"
    elif case == "bad_json":
        lines[1] = lines[1][:-3]
    elif case == "missing_field":
        lines[1] = json.dumps({k: v for k, v in ROWS[1].items() if k != "question"})
    elif case == "other_benchmark":
        lines[0] = json.dumps(dict(ROWS[0], benchmark="math500"))
    elif case == "empty":
        lines = []
    elif case == "long_prompt":
        lines[1] = json.dumps(dict(ROWS[1], question="apples " * 3000))
    elif case == "greedy_samples":
        extra = ["--samples", "4"]
    elif case == "bad_meta":
        extra = ["--meta", "method"]
    data.write_text("".join(line + "\n" for line in lines))
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("{}")  # an earlier run's summary stays until a new one replaces it
    assert evaluate(model, data, out, *extra) == 2
    assert message in capsys.readouterr().err
    assert (out / "summary.json").read_text() == "{}"


def test_prompt_budget_check_counts_the_real_prompt(tiny_model_dir, tmp_path, capsys):
    """The length check uses the chat-templated prompt: prompt + budget must fit the positions."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    prompt = prompt_ids(tokenizer, "gsm8k", ROWS[0]["question"])
    check_lengths(ROWS[:1], [prompt], 2048 - len(prompt), 2048)
    data = write_rows(tmp_path / "gsm8k.jsonl", ROWS[:1])
    assert evaluate(tiny_model_dir, data, tmp_path / "over", "--budget", str(2049 - len(prompt))) == 2
    assert f"prompt of {len(prompt)} tokens plus budget {2049 - len(prompt)}" in capsys.readouterr().err


def test_a_second_evaluate_on_the_same_folder_is_refused(tiny_model_dir, tmp_path, capsys):
    from bfspo import runlock

    data = write_rows(tmp_path / "gsm8k.jsonl", ROWS[:1])
    with runlock.hold(tmp_path / "out", "evaluate"):
        assert evaluate(tiny_model_dir, data, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "is in use by bfspo evaluate" in err and "pid" in err
    assert not (tmp_path / "out" / "summary.json").exists()


def test_eval_run_has_intervals_in_its_summary_a_samples_table_and_tags(tiny_model_dir, tmp_path, monkeypatch):
    from bfspo import tracking
    from bfspo.reporting.sync import offline_runs

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    data = write_rows(tmp_path / "gsm8k.jsonl", ROWS)
    assert evaluate(tiny_model_dir, data, tmp_path / "out", "--limit", "3", "--wandb-project", "bfspo-tests",
                    "--meta", "method=dapo", "model_label=Tiny", "seed=0", "tables=table2,table3",
                    "--wandb-tags", "rehearsal") == 0
    summary = read_json(tmp_path / "out" / "summary.json")
    (offline,) = offline_runs(tmp_path / "out")
    record = tracking.read_run(offline)
    assert record["run"]["tags"] == ["table:table2", "table:table3", "method:dapo", "model:Tiny", "seed:0", "rehearsal"]
    config = record["run"]["config"]["update"]  # typed as a training run's; the results are not copied in
    assert config["seed"] == 0 and config["tables"] == ["table2", "table3"] and config["method_key"] == "dapo"
    assert not {"accuracy", "avg_length", "accuracy_ci", "meta"} & set(config) and config["benchmark"] == "gsm8k"
    wb = record["summary"]
    assert wb["eval/accuracy"] == pytest.approx(summary["accuracy"])
    assert wb["eval/accuracy_cutoff_wrong"] == pytest.approx(summary["accuracy_cutoff_wrong"])
    assert [wb["eval/avg_length_ci_low"], wb["eval/avg_length_ci_high"]] == pytest.approx(summary["avg_length_ci"])
    assert wb["eval/samples._type"] == "table-file" and wb["eval/samples.nrows"] == 3


def test_a_killed_evaluation_resumes_to_the_uninterrupted_result(tiny_model_dir, tmp_path):
    """SIGKILL in the middle of a sampled evaluation, then the same command again: the batches on file
    in samples.partial.jsonl are kept (not generated again), the others are generated with their own
    seeds, and samples.jsonl and summary.json equal those of an uninterrupted run."""
    rows = [{"id": f"q{i}", "question": f"What is {i} plus {'one ' * (i % 5)}two?", "answer": str(i + 2)}
            for i in range(40)]
    data = write_rows(tmp_path / "gsm8k.jsonl", rows)

    def command(out_dir):
        return [sys.executable, "-m", "bfspo.cli", "evaluate", "--model", str(tiny_model_dir), "--benchmark", "gsm8k",
                "--data", str(data), "--out-dir", str(out_dir), "--budget", "24", "--samples", "2",
                "--temperature", "1", "--batch-size", "4", "--seed", "3"]

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert process.run(command(whole), env=env, capture_output=True, timeout=300).returncode == 0

    partial = resumed / "samples.partial.jsonl"
    with process.started(command(resumed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        deadline = time.time() + 240
        while proc.poll() is None and time.time() < deadline and not (
                partial.exists() and len(partial.read_text().splitlines()) >= 4):
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (resumed / "summary.json").exists() and not (resumed / "samples.jsonl").exists()
    on_file = []
    for line in partial.read_text().splitlines()[1:]:
        try:
            on_file.append(json.loads(line))
        except json.JSONDecodeError:  # the batch being appended when the kill came
            pass
    assert 3 <= len(on_file) < 20, "the evaluation was not killed in the middle"

    again = process.run(command(resumed), env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"resuming, {len(on_file)} of 20 batches ({2 * len(on_file)} questions) already done" in again.stdout
    assert (resumed / "samples.jsonl").read_text() == (whole / "samples.jsonl").read_text()
    timing = ("generation_seconds", "generated_tokens_per_s")
    summary, reference = read_json(resumed / "summary.json"), read_json(whole / "summary.json")
    assert {k: v for k, v in summary.items() if k not in timing} == {k: v for k, v in reference.items() if k not in timing}
    # the killed run's batches count with their own generation time: they were not generated again
    assert summary["generation_seconds"] >= round(sum(r["seconds"] for r in on_file), 3)
    assert not partial.exists()
