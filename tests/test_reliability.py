"""Issue 23, the second reliability probe: nothing half-loaded, nothing poisoned, nothing scored wrong
in silence. One section per finding; each test failed before its fix."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch

from bfspo.cli import main
from bfspo.errors import BfspoError
from bfspo.io import read_json, read_jsonl
from bfspo.tasks import verify

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = [{"id": f"q{i}", "question": f"Tom has {i} apples and buys 3 more. How many?", "answer": str(i + 3)}
             for i in range(3)]


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def evaluate(model_dir, data, out_dir, *extra) -> int:
    return main(["evaluate", "--model", str(model_dir), "--benchmark", "gsm8k", "--data", str(data),
                 "--out-dir", str(out_dir), "--budget", "8", "--batch-size", "8", *extra])


def train_config(model_dir, data, **overrides):
    from bfspo.training.config import TrainConfig

    values = dict(model=str(model_dir), train_data=str(data), benchmark="gsm8k_train", k=0, group_size=4, budget=16,
                  steps=1, train_batch=8, mini_batch=4, lr=1e-2, save_every=1, max_empty_steps=50, threads=1,
                  wandb_mode="disabled", log_trees=0)
    return TrainConfig(**(values | overrides))


def edited_model(src: Path, dst: Path, config=None, weights=None) -> Path:
    """A copy of the model folder `src`, its config.json and weights edited in place."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    if config is not None:
        values = json.loads((dst / "config.json").read_text())
        config(values)
        (dst / "config.json").write_text(json.dumps(values))
    if weights is not None:
        tensors = load_file(dst / "model.safetensors")
        weights(tensors)
        save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def three_layers(c):
    c.update(num_hidden_layers=3, layer_types=["full_attention"] * 3)


# ---- 1 and 6: weights that do not match the config ---------------------------------------------------


@pytest.mark.parametrize("config, weights, named", [
    (three_layers, None, r"12 missing \(model\.layers\.2\."),
    (None, lambda w: w.pop("model.norm.weight"), r"1 missing \(model\.norm\.weight\)"),
    (None, lambda w: w.update({"model.extra.weight": torch.zeros(3)}), r"1 unexpected \(model\.extra\.weight\)"),
    (None, lambda w: w.update({"model.norm.weight": torch.ones(31)}),
     r"1 of another shape \(model\.norm\.weight is \[31\] in the weights, \[32\] in the model"),
], ids=["config-asks-for-more-layers", "no-final-norm", "unexpected-key", "another-shape"])
def test_weights_that_do_not_match_the_config_are_a_named_error(tiny_model_dir, tmp_path, config, weights, named):
    from bfspo import model_io

    model = edited_model(tiny_model_dir, tmp_path / "model", config, weights)
    for load in ("load_model", "check_weights"):  # the transformers path, and the check made for vLLM
        with pytest.raises(BfspoError, match=re.escape(str(model)) + ": its weights do not match its config.json: "
                           + named):
            getattr(model_io, load)(str(model))


def test_tied_embeddings_are_no_missing_key(tiny_model_dir, tmp_path):
    """lm_head.weight is absent (tied to the embeddings) in the tiny model, or saved beside them."""
    from bfspo.model_io import check_weights, load_model

    assert json.loads((tiny_model_dir / "config.json").read_text())["tie_word_embeddings"]
    model = edited_model(tiny_model_dir, tmp_path / "model",
                         weights=lambda w: w.update({"lm_head.weight": w["model.embed_tokens.weight"].clone()}))
    for path in (tiny_model_dir, model):
        check_weights(str(path))
        loaded, _ = load_model(str(path))
        assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()


def test_a_layer_count_that_contradicts_layer_types_is_a_named_error(tiny_model_dir, tmp_path):
    from bfspo.model_io import load_config, load_model

    model = edited_model(tiny_model_dir, tmp_path / "model", config=lambda c: c.update(num_hidden_layers=3))
    message = re.escape(f"{model}: its config.json contradicts itself (`num_hidden_layers` (3) must be equal to "
                        "the number of `layer_types` (2))")
    for load in (load_config, load_model):
        with pytest.raises(BfspoError, match=message):
            load(str(model))


def test_train_and_evaluate_refuse_a_partly_random_model_before_any_work(tiny_model_dir, train_data, tmp_path, capsys):
    model = edited_model(tiny_model_dir, tmp_path / "model", weights=lambda w: w.pop("model.norm.weight"))
    data = write_rows(tmp_path / "gsm8k.jsonl", QUESTIONS)
    assert evaluate(model, data, tmp_path / "eval") == 2
    assert "model.norm.weight" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "eval").iterdir()) == [".bfspo.lock"]
    assert main(["train", "--output-dir", str(tmp_path / "run"), "--set", f"model={model}",
                 f"train_data={train_data}", "steps=1", "train_batch=4", "mini_batch=4", "wandb_mode=disabled"]) == 2
    assert "its weights do not match its config.json" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".bfspo.lock"]


# ---- 2: non-finite weights --------------------------------------------------------------------------


@pytest.mark.parametrize("override, named", [
    ("lr=1e30", "lr must be a number > 0 and at most 1"),
    ("lr=.inf", "lr must be a number > 0 and at most 1"),
    ("lr=.nan", "lr must be a number > 0 and at most 1, got nan"),
    ("weight_decay=.inf", "weight_decay must be a number >= 0 and at most 1"),
    ("weight_decay=.nan", "weight_decay must be a number"),
    ("max_grad_norm=.inf", "max_grad_norm must be a finite number"),
    ("eps_high=.inf", "eps_high must be a finite number"),
    ("oversample=.inf", "oversample must be a number >= 1 and at most 100"),
    ("temperature=.inf", "temperature must be a finite number > 0, got inf"),
    ("top_p=.nan", "top_p must be a number"),
])
def test_infinite_nan_or_absurd_values_are_refused_by_the_config(override, named):
    from bfspo.training.config import load_train_config

    with pytest.raises(BfspoError, match=re.escape(named)):
        load_train_config(None, ["model=m", "train_data=d", override])


def _adam(lr, weight_decay=0.0):
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    params = list(layer.parameters())
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    return layer, params, optimizer


def _backward(layer):
    layer(torch.randn(5, 4)).pow(2).sum().backward()


def test_an_update_that_makes_a_weight_non_finite_is_undone():
    from bfspo.training.nonfinite import step_if_finite

    layer, params, optimizer = _adam(lr=1e-2)
    _backward(layer)
    assert step_if_finite(optimizer, params)  # a normal step is kept
    kept = [p.detach().clone() for p in params]
    state = json.dumps({k: [t.tolist() if torch.is_tensor(t) else t for t in v.values()]
                        for k, v in optimizer.state_dict()["state"].items()})
    optimizer.param_groups[0]["lr"] = float("inf")
    optimizer.zero_grad()
    _backward(layer)
    assert not step_if_finite(optimizer, params)
    assert all(torch.equal(p, k) for p, k in zip(params, kept))
    assert json.dumps({k: [t.tolist() if torch.is_tensor(t) else t for t in v.values()]
                       for k, v in optimizer.state_dict()["state"].items()}) == state
    optimizer.param_groups[0]["lr"] = 1e-2
    assert step_if_finite(optimizer, params) and not all(torch.equal(p, k) for p, k in zip(params, kept))


class _Adapter(torch.nn.Module):
    """A model with one trainable and one frozen weight that saves like a peft model."""

    def __init__(self):
        super().__init__()
        self.lora = torch.nn.Parameter(torch.ones(2))
        self.base = torch.nn.Parameter(torch.full((2,), float("nan")), requires_grad=False)

    def save_pretrained(self, path):
        path.mkdir(parents=True)
        torch.save(self.lora.detach(), path / "adapter.pt")


def test_a_checkpoint_is_never_written_with_non_finite_tensors(tmp_path):
    from bfspo.training import checkpoint

    model = _Adapter()
    optimizer = torch.optim.AdamW([model.lora], lr=1e-2)
    checkpoint.save(tmp_path, model, optimizer, {"step": 1})  # a frozen NaN is not the checkpoint's
    with torch.no_grad():
        model.lora[0] = float("inf")
    with pytest.raises(BfspoError, match=r"checkpoint: not written, since 1 tensor\(s\) hold NaN or inf \(lora\); "
                                         "the previous checkpoint is kept"):
        checkpoint.save(tmp_path, model, optimizer, {"step": 2})
    with torch.no_grad():
        model.lora[0] = 1.0
    model.lora.grad = torch.ones(2)
    optimizer.step()
    optimizer.state[model.lora]["exp_avg_sq"][0] = float("nan")
    with pytest.raises(BfspoError, match=r"optimizer exp_avg_sq of parameter 0"):
        checkpoint.save(tmp_path, model, optimizer, {"step": 2})
    assert not (tmp_path / "checkpoint.tmp").exists()
    assert torch.load(checkpoint.latest(tmp_path) / "state.pt", weights_only=True)["step"] == 1


def test_a_non_finite_update_in_training_is_skipped_counted_and_never_checkpointed(tiny_model_dir, train_data,
                                                                                    tmp_path):
    """The probe's lr = inf (no longer accepted by the config, so set on the optimizer): each update is
    undone and counted, the checkpoint holds the initial finite adapter, and max_nonfinite stops the run."""
    from peft.utils import load_peft_weights

    from bfspo.training.trainer import Trainer

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    trainer = Trainer(train_config(tiny_model_dir, train_data), run_dir)
    initial = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.optimizer.param_groups[0]["lr"] = float("inf")
    with pytest.raises(BfspoError, match="no optimizer step in 1 steps"):
        trainer.fit()
    (row,) = [r for _, r in read_jsonl(run_dir / "metrics.jsonl")]
    # one per mini-batch of the step: how many groups the random tiny model mixes right and wrong
    # answers in (fewer since a cut-off answer counts as wrong, issue 22)
    assert row["train/skipped_steps"] == row["train/nonfinite_total"] == trainer.nonfinite >= 1
    assert all(torch.equal(p, initial[n]) for n, p in trainer.model.named_parameters() if p.requires_grad)
    saved = load_peft_weights(str(run_dir / "checkpoint" / "adapter"), device="cpu")
    assert saved and all(torch.isfinite(t).all() for t in saved.values())
    trainer.cfg = dataclasses.replace(trainer.cfg, max_nonfinite=trainer.nonfinite)
    batch = []
    for _ in range(5):  # the next step whose batch holds a group with mixed answers
        trainer.step += 1
        batch, _, _ = trainer.rollout()
        if batch:
            break
    assert batch, "no group with mixed answers in 5 steps"
    with pytest.raises(BfspoError, match=f"non-finite losses, gradients or updates, more than max_nonfinite={trainer.nonfinite}"):
        trainer.update(batch)


# ---- 3: the verifier under load ---------------------------------------------------------------------


@pytest.fixture
def fresh_pool(monkeypatch):
    """A pool of its own (the module's is shared by the whole test session), closed afterwards."""
    monkeypatch.setattr(verify, "_POOL", None)
    yield
    if verify._POOL is not None:
        for worker in verify._POOL.workers:
            worker.close()


def _verify_workers() -> set[int]:
    """The live math-verify worker processes of this process, read from /proc (not from the pool)."""
    pids = set()
    for children in Path("/proc/self/task").glob("*/children"):
        for pid in children.read_text().split():
            try:
                if b"serve_verifier" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    pids.add(int(pid))
            except OSError:  # gone meanwhile
                pass
    return pids


def _in_threads(check, args) -> dict:
    """check(arg) in one thread per arg, all at once: arg -> its result, or the exception it raised."""
    results = {}

    def call(arg):
        try:
            results[arg] = check(arg)
        except Exception as e:
            results[arg] = e

    threads = [threading.Thread(target=call, args=(arg,)) for arg in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_many_threads_at_once_get_correct_answers_scored_right(fresh_pool):
    """The probe's 48 threads at once (here 24, and a 2 s deadline): every thread started a worker of
    its own, and a worker's start-up crowded out the comparisons of the others, past their deadline."""
    before = _verify_workers()
    results = _in_threads(lambda i: verify.is_correct("math500", f"\\boxed{{\\frac{{{i}}}{{2}}}}", str(i / 2),
                                                      timeout=2.0), range(1, 25))
    assert {i: ok for i, ok in results.items() if ok is not True} == {}
    started = _verify_workers() - before
    assert 1 <= len(started) <= verify._pool().size <= 8


def test_a_worker_outlives_the_thread_that_started_it(fresh_pool):
    before = _verify_workers()
    check = lambda i: verify.is_correct("math500", f"\\boxed{{\\frac{{{i}}}{{3}}}}", f"{i}/3")  # noqa: E731
    assert _in_threads(check, [1]) == {1: True}
    time.sleep(1)  # the kernel killed a worker tied to its thread within milliseconds of the thread's end
    started = _verify_workers() - before
    assert len(started) == 1
    assert _in_threads(check, [2]) == {2: True}
    assert _verify_workers() - before == started


def test_a_repeated_timeout_is_cached_and_counted_again(fresh_pool):
    """Issue 46: a repeated pathological answer cost its deadline again; its timeout is cached, so a
    repeat costs nothing, and counted again (the answer is scored False for a timeout each time)."""
    verify.clear_cache()
    before = verify.timeouts()
    assert not verify.is_correct("math500", "\\boxed{9^{9^{9^{9}}}}", "1", timeout=1.0)
    start = time.monotonic()
    for _ in range(3):
        assert not verify.is_correct("math500", "\\boxed{9^{9^{9^{9}}}}", "1", timeout=1.0)
    assert time.monotonic() - start < 0.1 and verify.timeouts() == before + 4


def test_slow_comparisons_do_not_hold_up_ordinary_ones(fresh_pool):
    """Issue 46: 8 pathological answers delayed 100 ordinary ones by about 27 s each: every worker sat
    on a pathological comparison until its deadline. A caller that finds every worker on a slow
    comparison starts another, so ordinary answers wait far less than the deadline."""
    verify.clear_cache()
    verify._POOL = verify._WorkerPool(1)  # one worker, held by one pathological answer (one core busy)
    deadline = 10.0
    verify.is_correct("math500", "\\boxed{\\frac{1}{3}}", "0.5", timeout=deadline)  # the worker, started
    slow = ["\\boxed{9^{9^{9^{9}}}}"]
    waits = {}

    def check(arg):
        start = time.monotonic()
        if isinstance(arg, str):
            return verify.is_correct("math500", arg, "1", timeout=deadline)
        time.sleep(1.0)  # the pathological comparisons hold every worker by now
        ok = verify.is_correct("math500", f"\\boxed{{\\frac{{{arg}}}{{2}}}}", str(arg / 2), timeout=deadline)
        waits[arg] = time.monotonic() - start - 1.0
        return ok

    results = _in_threads(check, slow + list(range(1, 11)))
    assert {k: v for k, v in results.items() if isinstance(k, int) and v is not True} == {}
    assert max(waits.values()) < deadline / 2, waits
    assert len(verify._pool().workers) <= verify._pool().size  # the extra workers were given back


class _TimedOutPool:
    """Every comparison misses its deadline (a real one is slow to reach: see the test above)."""

    def __init__(self):
        self.calls = 0

    def verify(self, gold, answer, timeout):
        self.calls += 1
        raise verify.VerifyTimeout("took too long")


def test_the_step_metrics_report_verifications_that_timed_out(tiny_model_dir, tmp_path, monkeypatch):
    from bfspo.training import step_metrics
    from bfspo.training.trainer import Trainer

    pool = _TimedOutPool()
    monkeypatch.setattr(verify, "_pool", lambda: pool)
    verify.clear_cache()
    data = write_rows(tmp_path / "train.jsonl", [dict(q, answer="\\frac{x}{7}") for q in QUESTIONS])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    trainer = Trainer(train_config(tiny_model_dir, data, max_gen_rounds=1, oversample=1.0, budget=12), run_dir)
    _, _, stats = trainer.rollout()
    assert pool.calls > 0 and stats["verify_timeouts"] == pool.calls
    assert step_metrics.step_row(1, step_metrics.reduce_ranks([stats]))["rollout/verify_timeouts"] == pool.calls


def test_the_evaluation_summary_reports_verifications_that_timed_out(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """A real timeout: the tiny model's answers are replaced by a pathological one."""
    from bfspo.evaluation import evaluate as ev
    from bfspo.rollout.base import Completion

    class PathologicalEngine:
        def __init__(self, tokenizer):
            self.ids = tokenizer.encode("So the answer is \\boxed{9^{9^{9^{9}}}}.", add_special_tokens=False)

        def generate(self, contexts, n, max_new_tokens, **kwargs):
            return [[Completion(self.ids, [0.0] * len(self.ids), [0.0] * len(self.ids), True)] * n for _ in contexts]

    monkeypatch.setattr(ev, "make_engine", lambda kind, model, tokenizer, **kw: PathologicalEngine(tokenizer))
    monkeypatch.setattr(ev, "is_correct", lambda *a: verify.is_correct(*a, timeout=0.5))
    data = write_rows(tmp_path / "gsm8k.jsonl", QUESTIONS[:1])
    assert evaluate(tiny_model_dir, data, tmp_path / "out") == 0
    assert read_json(tmp_path / "out" / "summary.json")["verify_timeouts"] == 1
    assert [s["verify_timeout"] for _, s in read_jsonl(tmp_path / "out" / "samples.jsonl")] == [True]
    assert "1 verification(s) missed their deadline and were scored wrong" in capsys.readouterr().out


# ---- 4: temperature NaN and inf ---------------------------------------------------------------------


@pytest.mark.parametrize("temperature", ["nan", "inf", "-inf"])
def test_evaluate_refuses_a_nan_or_infinite_temperature_before_writing(tiny_model_dir, tmp_path, capsys, temperature):
    data = write_rows(tmp_path / "gsm8k.jsonl", QUESTIONS)
    assert evaluate(tiny_model_dir, data, tmp_path / "out", f"--temperature={temperature}") == 2
    assert f"temperature must be a finite number >= 0 (0 is greedy decoding), got {float(temperature)}" \
        in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ---- 5: a changed evaluation rerun ------------------------------------------------------------------


def test_a_rerun_with_other_settings_moves_the_finished_results_away(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from bfspo.evaluation import evaluate as ev

    data = write_rows(tmp_path / "gsm8k.jsonl", QUESTIONS)
    out = tmp_path / "out"
    assert evaluate(tiny_model_dir, data, out, "--samples", "2", "--temperature", "1.0", "--batch-size", "2") == 0
    finished = (out / "summary.json").read_text(), (out / "samples.jsonl").read_text()
    batches = []

    def killed_after_one_batch(*args):
        if batches:
            raise KeyboardInterrupt
        batches.append(args)
        return score(*args)

    score = ev.score
    monkeypatch.setattr(ev, "score", killed_after_one_batch)
    capsys.readouterr()
    assert evaluate(tiny_model_dir, data, out, "--samples", "2", "--temperature", "0.5", "--batch-size", "2") == 130
    assert not (out / "summary.json").exists() and not (out / "samples.jsonl").exists()
    assert (out / "samples.partial.jsonl").exists()
    assert ((out / "previous/1/summary.json").read_text(), (out / "previous/1/samples.jsonl").read_text()) == finished
    assert (f"{out}: moved the summary.json and samples.jsonl of an earlier evaluation (other temperature) to "
            f"{out / 'previous/1'}, where they stay until you delete them; starting over") in capsys.readouterr().out


def test_an_identical_rerun_of_a_finished_evaluation_is_already_done(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from bfspo.evaluation import evaluate as ev

    data = write_rows(tmp_path / "gsm8k.jsonl", QUESTIONS)
    out = tmp_path / "out"
    assert evaluate(tiny_model_dir, data, out, "--meta", "method=base") == 0
    written = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != ".bfspo.lock"}

    def no_generation(args):
        raise AssertionError("the model was loaded again")

    monkeypatch.setattr(ev, "build_engine", no_generation)
    capsys.readouterr()
    os.utime(data, ns=(0, data.stat().st_mtime_ns + 10**9))  # touched (issue 31: an input is its content)
    assert evaluate(tiny_model_dir, data, out, "--meta", "method=base") == 0
    assert "already done with these settings" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != ".bfspo.lock"} == written


# ---- 7: bad configs caught when the workflow is planned ---------------------------------------------


def _plan(**edits):
    """The runs and evaluations of a small valid plan, with `edits` applied to the run's settings."""
    runs = {"r": dict(model="Qwen/Qwen2.5-3B-Instruct", train_data="d.jsonl", benchmark="gsm8k_train", budget=512,
                      group_size=4, train_batch=8, mini_batch=4) | edits}
    evaluations = [dict(model="Qwen/Qwen2.5-3B-Instruct", benchmark="gsm8k", budget=512)]
    return runs, evaluations


def test_the_plan_check_runs_each_run_through_the_trainers_validation(tiny_model_dir):
    from bfspo.pipeline.preflight import plan_problems

    assert plan_problems(*_plan()) == []
    assert plan_problems(*_plan(lr=float("nan"))) == ["config: lr must be a number > 0 and at most 1, got nan (run r)"]
    assert plan_problems(*_plan(mini_batch=3)) == [
        "config: train_batch (8) must be a multiple of mini_batch (3) (run r)"]
    runs, evaluations = _plan()
    evaluations.append(dict(model="Qwen/Qwen2.5-3B-Instruct", benchmark="aime25", budget=1024, samples=4,
                            temperature=0))
    assert plan_problems(runs, evaluations) == [
        "evaluation: 4 samples per question at temperature 0 would all be the same greedy response (benchmark aime25)"]
    # a local model folder's positions (the tiny model has 2048); a hub id is not looked up
    runs, evaluations = _plan(model=str(tiny_model_dir), budget=4096)
    evaluations.append(dict(model=str(tiny_model_dir), benchmark="math500", budget=2048))
    assert plan_problems(runs, evaluations) == [
        f"train: budget 4096 leaves no room for a prompt in the 2048 positions of model {tiny_model_dir} "
        "(max_position_embeddings in its config.json) (run r)",
        f"evaluation: budget 2048 leaves no room for a prompt in the 2048 positions of model {tiny_model_dir} "
        "(max_position_embeddings in its config.json) (benchmark math500)"]


def test_a_dry_run_stops_on_settings_every_job_would_refuse(tmp_path):
    from tests.test_workflow import snakemake, write_config

    def edit(c):
        c["methods"]["dapo"]["train"] = {"lr": float("nan")}
        c["methods"]["bfspo"]["train"] = {"mini_batch": 5}
        c["benchmarks"]["toy"].update(samples=4, temperature=0)

    proc = snakemake("-n", "--nolock", "--configfile", str(write_config(tmp_path, "config/config.yaml", edit)))
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "invalid config" in output
    for problem in ("config: lr must be a number > 0 and at most 1, got nan (run toy_toy_dapo_s0",
                    "config: train_batch (48) must be a multiple of mini_batch (5) (run toy_toy_bfspo_s0",
                    "evaluation: 4 samples per question at temperature 0 would all be the same greedy response "
                    "(benchmark toy)"):
        assert problem in output


# ---- 8: the low ones --------------------------------------------------------------------------------


def test_train_refuses_duplicate_question_ids(tiny_model_dir, tmp_path):
    from bfspo.model_io import load_tokenizer
    from bfspo.training.trainer import load_questions

    data = write_rows(tmp_path / "train.jsonl", QUESTIONS + [dict(QUESTIONS[1], question="Another question?")])
    with pytest.raises(BfspoError, match=re.escape(f"{data}:4: duplicate id 'q1'")):
        load_questions(train_config(tiny_model_dir, data), load_tokenizer(str(tiny_model_dir)), None)


def test_a_data_path_that_is_a_directory_says_so(tmp_path):
    with pytest.raises(BfspoError, match=re.escape(f"{tmp_path}: a directory, not a file")):
        list(read_jsonl(tmp_path))


def test_an_output_directory_that_is_a_symlink_loop_is_named(tmp_path):
    from bfspo import runlock

    (tmp_path / "out").symlink_to(tmp_path / "out")
    with pytest.raises(BfspoError, match=r"out: a symbolic link \(to .*out\) that leads to no directory: it loops"):
        with runlock.hold(tmp_path / "out", "train"):
            pass


def test_a_single_answer_per_question_is_refused_at_the_start():
    from bfspo.training.config import TrainConfig

    with pytest.raises(BfspoError, match="group_size 1 with k 0 gives each question a single answer"):
        TrainConfig(model="m", train_data="d", group_size=1, k=0)
    assert TrainConfig(model="m", train_data="d", group_size=1, k=1).group_size == 1  # expansions add answers


def test_stripping_deeply_nested_wrappers_is_linear():
    """8 million characters of wrappers: about 20 minutes if each wrapper removed copied the rest, as
    it did (3.4 s for 400k characters); milliseconds now."""
    n = 4_000_000
    assert verify._strip_answer("$" * n + " \\(**42**\\)." + "$" * n) == "42"
    assert verify._strip_answer("$" * n + "$x" + "$" * n) == "$x"  # one $ left unpaired
    assert verify._strip_answer("$\\(" * 10_000 + ": 7 /" + "\\)$" * 10_000) == "7"


# ---- issue 39: a finished run to start again ---------------------------------------------------------


@pytest.fixture(scope="module")
def finished(tiny_model_dir, tmp_path_factory):
    """A finished one-step run, its data and its command's --set values."""
    root = tmp_path_factory.mktemp("finished")
    data = write_rows(root / "train.jsonl", [dict(q, id=f"t{i}") for i, q in enumerate(QUESTIONS * 4)])
    values = dict(model=str(tiny_model_dir), train_data=str(data), benchmark="gsm8k_train", k=0, group_size=4,
                  budget=10, steps=1, train_batch=8, mini_batch=8, lr=1e-2, max_empty_steps=50, threads=1,
                  wandb_mode="disabled", log_trees=0)
    assert train(root / "run", values) == 0
    return root / "run", values


def train(out, values: dict, **overrides) -> int:
    return main(["train", "--output-dir", str(out), "--set", *[f"{k}={v}" for k, v in (values | overrides).items()]])


def copied(run: Path, tmp_path: Path) -> Path:
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


# ---- issue 39, finding 6: damaged records and deep JSON are named, never a traceback -------------------

DEEP_ROW = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("name, content, problem", [
    ("config.json", b'["a", "list"]', "expected a JSON object, got list"),
    ("config.json", b'{"model": "\xff"}', "not UTF-8 text (byte 12)"),
    ("inputs.json", b'{"train_data": {"train.jsonl": "\xfe"}}', "not UTF-8 text (byte 33)"),
    ("inputs.json", ('{"model": ' + DEEP_ROW + '}').encode(), "JSON nested more than 100 levels deep"),
], ids=["config-a-list", "config-not-utf8", "inputs-not-utf8", "inputs-deep"])
def test_a_damaged_run_record_is_named(finished, tmp_path, capsys, name, content, problem):
    """The probe's AttributeError, UnicodeDecodeError and RecursionError tracebacks (exit 1)."""
    run, values = finished
    run = copied(run, tmp_path)
    (run / name).write_bytes(content)
    capsys.readouterr()
    assert train(run, values) == 2
    err = capsys.readouterr().err
    assert f"error: {run / name}: {problem}" in err and "Traceback" not in err


def test_a_deep_row_in_the_middle_of_metrics_is_named_on_resume(finished, tmp_path, capsys):
    run, values = finished
    run = copied(run, tmp_path)
    (run / "done.json").unlink()
    (run / "metrics.jsonl").write_text(DEEP_ROW + "\n" + (run / "metrics.jsonl").read_text())
    assert train(run, values) == 2
    err = capsys.readouterr().err
    assert f"{run / 'metrics.jsonl'}:1: JSON nested more than 100 levels deep, in the middle of the file" in err
    assert "Traceback" not in err


def test_a_deep_row_of_training_or_evaluation_data_is_named(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "gsm8k.jsonl"
    data.write_text(json.dumps(QUESTIONS[0]) + "\n" + '{"id": "q9", "question": ' + DEEP_ROW + "}\n")
    assert evaluate(tiny_model_dir, data, tmp_path / "eval") == 2
    assert train(tmp_path / "run", dict(model=tiny_model_dir, train_data=data, steps=1, train_batch=4, mini_batch=4,
                                        wandb_mode="disabled")) == 2
    err = capsys.readouterr().err
    assert err.count(f"error: {data}:2: JSON nested more than 100 levels deep") == 2 and "Traceback" not in err


def test_the_json_readers_name_every_damaged_document(tmp_path):
    from bfspo.io import read_json

    for content, problem in [(b"[1, 2]", "expected a JSON object, got list"), (b'"text"', "got str"),
                             (b"\xff\xfe", "not UTF-8 text (byte 1)"), (b"{" * 200_000, "nested more than 100"),
                             (b'{"a": 1,\n "b": }', "not valid JSON (Expecting value at line 2 column 7)")]:
        (tmp_path / "x.json").write_bytes(content)
        with pytest.raises(BfspoError, match=re.escape(f"{tmp_path / 'x.json'}: ") + ".*" + re.escape(problem)):
            read_json(tmp_path / "x.json")
    doc = json.dumps({"a": [[{"b": "[[[[{{{{"}]] * 3})  # 4 levels; brackets in strings are not nesting
    for _ in range(95):
        doc = f"[{doc}]"
    (tmp_path / "x.json").write_text(f'{{"x": {doc}}}')  # 100 levels: read
    assert read_json(tmp_path / "x.json")["x"][0]
    (tmp_path / "x.json").write_text(f'{{"x": [{doc}]}}')
    with pytest.raises(BfspoError, match="nested more than 100 levels deep"):
        read_json(tmp_path / "x.json")


# ---- issue 39, finding 7: settings that change only memory are not a run's identity --------------------


@pytest.mark.parametrize("field, value", [("gradient_checkpointing", "true"), ("gpu_memory_utilization", 0.2),
                                          ("max_num_seqs", 64)])
def test_a_memory_only_setting_changed_on_a_finished_run_is_the_same_run(finished, tmp_path, capsys, field, value):
    """The probe's finished run refused as a config change. On the transformers engine vLLM's settings
    are not read at all."""
    run, values = finished
    run = copied(run, tmp_path)
    capsys.readouterr()
    assert train(run, values, **{field: value}) == 0
    assert "already finished" in capsys.readouterr().out


@pytest.mark.parametrize("rollout, seeds, same", [("streamed", "true", False), ("lockstep", "null", False),
                                                  ("lockstep", "true", True)])
def test_vllms_memory_settings_are_memory_only_where_each_request_has_its_own_seed_in_lockstep(rollout, seeds, same):
    """A streamed rollout adds questions as vLLM has room, and an engine seeded once hands out its random
    numbers in its scheduler's order: there, max_num_seqs and gpu_memory_utilization change what is trained."""
    from bfspo.training.config import identity_ignores, load_train_config

    values = load_train_config(None, ["model=m", "train_data=d", "engine=vllm", f"rollout={rollout}",
                                      f"per_request_seeds={seeds}"]).to_dict()
    ignored = identity_ignores(values)
    assert "gradient_checkpointing" in ignored
    assert ({"max_num_seqs", "gpu_memory_utilization"} <= ignored) == same
    assert not {"lr", "k", "seed", "rollout_batch_size", "per_request_seeds", "engine", "rollout"} & ignored


def test_gradient_checkpointing_trains_the_same_bytes(finished, tmp_path):
    """It recomputes the same operations on the same values: on the CPU the adapter is equal byte for byte."""
    run, values = finished
    assert train(tmp_path / "run", values, gradient_checkpointing="true") == 0
    assert read_json(tmp_path / "run" / "done.json")["adapter_sha256"] == read_json(run / "done.json")["adapter_sha256"]


# ---- issue 39, finding 9: a run is the content of its inputs, not their paths -------------------------


def test_the_same_bytes_under_other_paths_are_the_same_run(finished, tiny_model_dir, tmp_path, capsys):
    """The probe's copy of the data under another path was refused as a config change (train_data). The
    model and the data, copied elsewhere (the data under another name): the run is finished. Other bytes
    at the new path: the run is set aside and trained afresh, as other bytes at the old path are."""
    run, values = finished
    run = copied(run, tmp_path)
    model, data = tmp_path / "elsewhere" / "model", tmp_path / "elsewhere" / "rl.jsonl"
    shutil.copytree(tiny_model_dir, model)
    shutil.copy(values["train_data"], data)
    capsys.readouterr()
    assert train(run, values, model=model, train_data=data) == 0
    assert "already finished" in capsys.readouterr().out
    write_rows(data, [dict(q, id=f"other{i}") for i, q in enumerate(QUESTIONS * 4)])
    assert train(run, values, model=model, train_data=data) == 0
    out = capsys.readouterr().out
    assert "its inputs changed since the run there was made (train_data (rl.jsonl, train.jsonl))" in out
    assert (run / "previous" / "1" / "done.json").exists() and read_json(run / "config.json")["train_data"] == str(data)


# ---- issue 46, finding 6: a damaged config.json of a local model is named at plan time ----------------


@pytest.mark.parametrize("damage, named", [
    (b"\xff\xfe{}", "/config.json: not UTF-8 text (byte 1)"),
    (b"[1]", "/config.json: expected a JSON object, got list"),
    (b"[" * 100_000, "/config.json: JSON nested more than 100 levels deep"),
    (b'{"model_type": "qwen2", "hidden_size": 0, "intermediate_size": 64, "num_hidden_layers": 2, '
     b'"num_attention_heads": 4, "vocab_size": 320, "max_position_embeddings": 512}',
     ": config.json lacks a positive integer hidden_size"),
])
def test_plan_names_a_damaged_config_json_of_a_local_model(tiny_model_dir, tmp_path, damage, named, capsys):
    """`bfspo plan` (and `snakemake -n`, which plans the same way) gave a UnicodeDecodeError, an
    AttributeError or a RecursionError traceback."""
    import yaml

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "config.json").write_bytes(damage)
    cfg = yaml.safe_load((ROOT / "config/test.yaml").read_text())
    cfg["models"]["toy-test"]["path"] = str(model)
    cfg["resources"]["cpu"] = {"gpus": 1, "eval_gpus": 1, "cpus_per_gpu": 4, "mem_mb": 16000, "train_runtime": 60,
                               "eval_runtime": 15}  # a GPU class: its jobs are planned from the model's shapes
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    assert main(["plan", "--config", str(config)]) == 2
    assert f"{model}{named}" in capsys.readouterr().err


# ---- issue 46, low: a truncated samples.jsonl beside an intact summary.json is not "already done" ------


def test_an_evaluation_whose_samples_were_truncated_is_not_done(tiny_model_dir, tmp_path, capsys):
    data = write_rows(tmp_path / "gsm8k.jsonl", QUESTIONS)
    out = tmp_path / "eval"
    assert evaluate(tiny_model_dir, data, out) == 0
    samples = (out / "samples.jsonl").read_bytes()
    assert evaluate(tiny_model_dir, data, out) == 0
    assert "already done with these settings" in capsys.readouterr().out
    (out / "samples.jsonl").write_bytes(samples[:len(samples) // 2])
    assert evaluate(tiny_model_dir, data, out) == 0
    said = capsys.readouterr().out
    assert "already done" not in said and "(a samples.jsonl that is not the one it recorded)" in said
    assert (out / "samples.jsonl").read_bytes() == samples  # evaluated again: greedy, the same answers
    assert (out / "previous" / "1" / "samples.jsonl").read_bytes() == samples[:len(samples) // 2]


# ---- issue 46, low: `threads` changes the adapter's bytes, and the docs say so -------------------------


def test_the_docs_do_not_list_threads_among_the_settings_that_change_nothing():
    """The probe: `threads=2` trained other adapter bytes, while docs/workflow.md listed `threads` with the
    memory-only settings. It stays out of a run's identity (the workflow sets it from a job's class), and
    the doc says what it changes."""
    from bfspo.training.config import OBSERVATION_FIELDS

    doc = (ROOT / "docs/workflow.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith("| only `OBSERVATION_FIELDS` differ"))
    unchanged, _, rounding = row.partition("how sums are rounded")
    assert "threads" in OBSERVATION_FIELDS and "`threads`" not in unchanged and "`threads`" in rounding
    assert "**Threads are not identity, though they change the bytes.**" in doc
