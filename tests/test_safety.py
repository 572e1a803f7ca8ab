"""Issue 31's findings 3 and 6-11: no code from a config, full disks, giant rows, foreign model folders,
loose field types, tables that two configs share, and model paths that cannot be loaded.
(Findings 4 and 5, the checkpoint's, are in tests/test_trainer.py.)"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
from pathlib import Path

import pytest

from bfspo import io
from bfspo.cli import main
from bfspo.errors import BfspoError

QUESTIONS = [{"id": f"q{i}", "question": f"Tom has {i} apples and buys 3 more. How many?", "answer": str(i + 3)}
             for i in range(3)]


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---- 3: no shell injection through the config ----------------------------------------------------------

# Shell placeholders that hold a whole argument list, which bfspo/pipeline (or the rule) builds with
# shlex.quote; every other placeholder of a `shell:` is quoted by Snakemake (`:q`).
ARGUMENT_LISTS = {"params.settings", "params.launcher", "params.args", "params.wandb", "params.reported",
                  "params.tags", "params.data", "params.tables", "params.runs", "params.sizes", "params.knobs",
                  "params.record", "params.numerics"}


def shell_commands(output: str) -> list[list[str]]:
    """The words of every shell command that a `snakemake -n -p` printed."""
    import shlex

    return [shlex.split(line.split("Shell command: ", 1)[1]) for line in output.splitlines()
            if line.startswith("Shell command: ")]


def test_every_placeholder_of_a_shell_command_is_quoted():
    root = Path(__file__).resolve().parents[1]
    unquoted = []
    for rules in sorted((root / "workflow/rules").glob("*.smk")):
        for block in re.findall(r"shell:\n((?:\s+f?\".*\"\n)+)", rules.read_text()):
            unquoted += [f"{rules.name}: {{{name}}}" for name in re.findall(r"\{([\w.]+)\}", block)
                         if name not in ARGUMENT_LISTS]
    assert unquoted == []


def _test_config_under(tmp_path, folder: str, record: Path | None = None) -> Path:
    """config/test.yaml with its results and its toy (data, model) under `folder`."""
    import yaml

    root = Path(__file__).resolve().parents[1]
    cfg = yaml.safe_load((root / "config/test.yaml").read_text().replace("results/toy-test/", f"{folder}/toy-test/"))
    cfg["results"] = folder
    if record is not None:
        cfg["toy"]["record"] = str(record)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def test_a_path_with_a_space_stays_one_argument_in_every_command(tmp_path):
    from tests.test_workflow import snakemake

    record = tmp_path / "recorded hashes" / "toy.sha256"
    record.parent.mkdir()
    record.write_text("")
    proc = snakemake("-n", "-p", "--forceall", "--nolock", "--configfile",
                     str(_test_config_under(tmp_path, "results/x y", record)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    commands = shell_commands(proc.stdout)
    rules = {w for words in commands for w in words if w in ("tables", "figures", "report", "hash", "train")}
    assert rules == {"tables", "figures", "report", "hash", "train"}
    split = [w for words in commands for w in words if w.endswith("results/x") or w.startswith("y/")
             or w in ("hashes/toy.sha256", str(tmp_path / "recorded"))]
    assert split == []
    assert any(w == str(record) for words in commands for w in words)


@pytest.mark.parametrize("payload", ["results/x$(touch PWNED)", "results/x;touch PWNED", "results/x`touch PWNED`",
                                     "-results"])
def test_a_path_with_shell_characters_is_refused_when_the_plan_is_made(tmp_path, payload):
    from tests.test_workflow import snakemake

    root = Path(__file__).resolve().parents[1]
    proc = snakemake("-n", "-p", "--forceall", "--nolock", "--configfile", str(_test_config_under(tmp_path, payload)))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "is not valid here (pattern:" in out  # the trimmed schema error (issue 33)
    assert f"'{payload}/toy-test/model' is not valid here" in out
    assert not (root / "PWNED").exists()


def test_the_toy_size_arguments_are_quoted():
    from bfspo.pipeline.matrix import toy_data_args

    assert toy_data_args({"n_train": 5, "max_value": "9; touch PWNED"}) == "--n-train 5 --max-value '9; touch PWNED'"


# ---- 6: a full disk outside the checkpoint ------------------------------------------------------------


def full_disk_at(monkeypatch, matches):
    """Make every write to a file whose path `matches` write half its bytes, then fail as a full disk does."""
    write_all = io._write_all

    def write(fd, data):
        if matches(Path(os.readlink(f"/proc/self/fd/{fd}"))):
            os.write(fd, data[:len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write_all(fd, data)

    monkeypatch.setattr(io, "_write_all", write)


def test_a_full_disk_at_an_append_names_the_file_and_cuts_the_partial_line(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n')
    full_disk_at(monkeypatch, lambda p: p == path)
    with pytest.raises(BfspoError, match=re.escape(f"{path}: writing it failed (No space left on device); ")
                       + r"\d+ MiB of disk space left there"):
        io.append_line(path, json.dumps({"step": 2, "loss": 0.5}))
    assert path.read_text() == '{"step": 1}\n'


def test_a_full_disk_at_an_atomic_write_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    path.write_text("old\n")
    full_disk_at(monkeypatch, lambda p: p.name.startswith(".summary.json."))
    with pytest.raises(BfspoError, match=re.escape(f"{path}: writing it failed (No space left on device)")):
        io.atomic_write_text(path, "new\n" * 1000)
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"] and path.read_text() == "old\n"


@pytest.mark.parametrize("name", ["samples.partial.jsonl", ".samples.partial.jsonl.", ".summary.json."])
def test_evaluate_on_a_full_disk_is_a_named_error_and_looks_unfinished(tiny_model_dir, tmp_path, monkeypatch, capsys,
                                                                      name):
    """The partial file's first write (atomic), its appended batches, and the summary."""
    data = write_rows(tmp_path / "gsm8k.jsonl", QUESTIONS)
    out = tmp_path / "eval"
    full_disk_at(monkeypatch, lambda p: p.name == name if not name.endswith(".") else p.name.startswith(name))
    assert main(["evaluate", "--model", str(tiny_model_dir), "--benchmark", "gsm8k", "--data", str(data),
                 "--out-dir", str(out), "--budget", "8", "--batch-size", "8"]) == 2
    err = capsys.readouterr().err
    target = name.strip(".") if name.endswith(".") else name
    assert f"error: {out / target}: writing it failed (No space left on device)" in err and "Traceback" not in err
    assert not (out / "summary.json").exists()  # what marks an evaluation finished
    assert (out / "samples.partial.jsonl").exists() == (name != ".samples.partial.jsonl.")  # a rerun resumes it


@pytest.mark.parametrize("name", ["metrics.jsonl", ".step_00001.jsonl."])
def test_train_on_a_full_disk_is_a_named_error_and_never_finished(tiny_model_dir, train_data, tmp_path, monkeypatch,
                                                                  capsys, name):
    out = tmp_path / "run"
    full_disk_at(monkeypatch, lambda p: p.name == name if not name.endswith(".") else p.name.startswith(name))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    assert main(["train", "--output-dir", str(out), "--set", f"model={tiny_model_dir}", f"train_data={train_data}",
                 "benchmark=gsm8k_train", "k=0", "group_size=4", "budget=8", "steps=1", "train_batch=4",
                 "mini_batch=4", "log_trees=1", "max_empty_steps=50", "wandb_mode=disabled"]) == 2
    err = capsys.readouterr().err
    target = out / "trees" / "step_00001.jsonl" if name.endswith(".") else out / name
    assert f"error: {target}: writing it failed (No space left on device)" in err and "Traceback" not in err
    assert not (out / "done.json").exists()
    # a run that fails gives its caller's signal handlers back (a later test's vLLM engine checks SIGUSR1's)
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    if (out / "metrics.jsonl").exists():
        assert all(line.endswith("}") for line in (out / "metrics.jsonl").read_text().splitlines())


def test_the_command_line_names_any_other_refused_file_operation(monkeypatch, capsys, tmp_path):
    """An OSError that no bfspo write wrapped (a library's own write) is a message and exit 1, not a traceback."""
    from bfspo.reporting import report

    def refuse(args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "figure.png"))

    monkeypatch.setattr(report, "run", refuse)
    assert main(["report", "--project", "p", "--group", "g", "--out", str(tmp_path / "r.json")]) == 1
    assert capsys.readouterr().err == f"bfspo report: error: {tmp_path / 'figure.png'}: No space left on device\n"


# ---- 7 and 9: one rule for the rows that training and evaluation read --------------------------------


def _train_questions(model_dir, data, **overrides):
    from bfspo.model_io import load_config, load_tokenizer
    from bfspo.training.config import TrainConfig
    from bfspo.training.trainer import load_questions

    cfg = TrainConfig(model=str(model_dir), train_data=str(data), benchmark="gsm8k_train", budget=16, **overrides)
    return load_questions(cfg, load_tokenizer(str(model_dir)),
                          load_config(str(model_dir)).max_position_embeddings)


def _eval_questions(model_dir, data):
    from bfspo.evaluation.evaluate import read_questions
    from bfspo.model_io import load_config
    from bfspo.tasks.benchmarks import get_benchmark

    return read_questions(data, get_benchmark("gsm8k"), None, load_config(str(model_dir)).max_position_embeddings)


def test_a_giant_row_is_refused_before_it_is_tokenised(tiny_model_dir, tmp_path, monkeypatch):
    """Issue 31, 7: the tiny model has 2048 positions, so a 1 MB question cannot fit; it is named by its
    line and id without reaching the tokeniser."""
    from bfspo.tasks import prompts

    data = write_rows(tmp_path / "train.jsonl", QUESTIONS + [{"id": "big", "question": "7 + " * 250_000,
                                                               "answer": "1"}])
    tokenised = []
    monkeypatch.setattr(prompts, "prompt_ids", lambda tokenizer, benchmark, question: tokenised.append(question) or [1])
    message = re.escape(f"{data}:4: question 'big' is 1000000 bytes, more than the model's 2048 positions can hold "
                        "at 32 bytes a token; refused before tokenising it")
    with pytest.raises(BfspoError, match=message):
        _train_questions(tiny_model_dir, data)
    assert tokenised == []
    with pytest.raises(BfspoError, match=message):
        _eval_questions(tiny_model_dir, data)


def test_numbers_are_answers_and_ids_as_text_in_training_and_evaluation(tiny_model_dir, tmp_path):
    """Issue 31, 9: `answer: 2.5` is the answer "2.5" (as in TRL and verl data sets), and ids 1 and "1" are
    one id, a duplicate, in both."""
    data = write_rows(tmp_path / "train.jsonl", [{"id": 1, "question": "Half of 5?", "answer": 2.5},
                                                 {"id": "2", "question": "Twice 3?", "answer": 6}])
    assert [(q.id, q.gold) for q in _train_questions(tiny_model_dir, data)] == [("1", "2.5"), ("2", "6")]
    assert [(r["id"], r["answer"]) for r in _eval_questions(tiny_model_dir, data)] == [("1", "2.5"), ("2", "6")]
    write_rows(data, [{"id": 1, "question": "Half of 5?", "answer": 2.5}, {"id": "1", "question": "Q", "answer": "1"}])
    for read in (_train_questions, _eval_questions):
        with pytest.raises(BfspoError, match=re.escape(f"{data}:2: duplicate id '1' (first on line 1;")):
            read(tiny_model_dir, data)


@pytest.mark.parametrize("row, problem", [
    ({"id": "a", "question": "Q", "answer": True}, "field 'answer' must be text or a number, got true/false"),
    ({"id": "a", "question": "Q", "answer": [1]}, "field 'answer' must be text or a number, got a list"),
    ({"id": 1.5, "question": "Q", "answer": "1"}, "field 'id' must be text or an integer, got a number"),
    ({"id": "a", "question": "  ", "answer": "1"}, "missing or empty field 'question'"),
    ({"id": "a", "question": "Q"}, "missing or empty field 'answer'"),
], ids=["bool", "list", "float-id", "blank", "absent"])
def test_a_field_of_another_type_is_named_the_same_way_in_both(tiny_model_dir, tmp_path, row, problem):
    data = write_rows(tmp_path / "train.jsonl", [row])
    for read in (_train_questions, _eval_questions):
        with pytest.raises(BfspoError, match=re.escape(f"{data}:1: {problem}")):
            read(tiny_model_dir, data)


# ---- 8: a model folder that asks for its own code -----------------------------------------------------


def test_a_folder_with_auto_map_and_an_unknown_model_type_is_a_named_error(tmp_path, capsys):
    """Its code is not run (trust_remote_code stays off), and the refusal is a message, not transformers'
    ValueError traceback."""
    model = tmp_path / "custom"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "foomodel", "auto_map": {
        "AutoConfig": "configuration_foo.FooConfig", "AutoModelForCausalLM": "modeling_foo.FooModel"}}))
    (model / "configuration_foo.py").write_text(f"open({str(tmp_path / 'PWNED')!r}, 'w')\n")
    data = write_rows(tmp_path / "gsm8k.jsonl", QUESTIONS)
    assert main(["evaluate", "--model", str(model), "--benchmark", "gsm8k", "--data", str(data),
                 "--out-dir", str(tmp_path / "eval"), "--budget", "8"]) == 2
    err = capsys.readouterr().err
    assert (f"error: {model}: its config.json asks for the model's own code (auto_map: configuration_foo.FooConfig, "
            "modeling_foo.FooModel), which bfspo never runs, and its model_type 'foomodel' is not one that "
            "transformers knows") in err and "Traceback" not in err
    assert not (tmp_path / "PWNED").exists()


def _custom_code_folder(tmp_path: Path) -> Path:
    """A model folder whose config.json maps every Auto class to the folder's own code, of a model_type
    transformers does not know; importing any of its modules writes tmp_path/PWNED."""
    model = tmp_path / "custom"
    model.mkdir()
    modules = {"AutoConfig": "configuration_foo.FooConfig", "AutoModelForCausalLM": "modeling_foo.FooModel",
               "AutoTokenizer": ["tokenization_foo.FooTokenizer", None]}
    (model / "config.json").write_text(json.dumps({"model_type": "foomodel", "auto_map": modules}))
    (model / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": modules["AutoTokenizer"]}}))
    for name in ("configuration_foo", "modeling_foo", "tokenization_foo"):
        (model / f"{name}.py").write_text(f"open({str(tmp_path / 'PWNED')!r}, 'a').write({name!r})\n")
    return model


@pytest.mark.parametrize("command", ["evaluate", "train"])
def test_a_yes_on_stdin_never_runs_a_model_folders_code(tmp_path, command):
    """Issue 39, finding 3: transformers, given no trust_remote_code, asked "Do you wish to run the custom
    code? [y/N]" on stdin, and a `y` there (a person at a terminal) imported the folder's code before
    bfspo's refusal came. Every load passes trust_remote_code=False: no question, and the refusal first."""
    import sys

    from tests.helpers import process

    model = _custom_code_folder(tmp_path)
    data = write_rows(tmp_path / "gsm8k.jsonl", QUESTIONS)
    args = {"evaluate": ["evaluate", "--model", str(model), "--benchmark", "gsm8k", "--data", str(data),
                         "--out-dir", str(tmp_path / "out"), "--budget", "8"],
            "train": ["train", "--output-dir", str(tmp_path / "out"), "--set", f"model={model}", f"train_data={data}",
                      "benchmark=gsm8k_train", "steps=1", "train_batch=4", "mini_batch=4", "wandb_mode=disabled"]}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "TRANSFORMERS_VERBOSITY": "error"}
    proc = process.run([sys.executable, "-m", "bfspo.cli", *args[command]], input="y\n" * 10, env=env,
                       capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Do you wish to run the custom code" not in proc.stdout + proc.stderr
    assert (f"error: {model}: its config.json asks for the model's own code (auto_map: configuration_foo.FooConfig, "
            "modeling_foo.FooModel") in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "PWNED").exists()


# ---- 11: a model that is not there ---------------------------------------------------------------------


def test_an_unreachable_hub_id_is_named_at_once(tmp_path):
    """Without HF_HUB_OFFLINE, a hub id that is not cached is asked about once: a hub that does not answer
    (here a closed port) is named with the id, in seconds rather than after a minute of retries."""
    import subprocess
    import sys
    import time

    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT="http://127.0.0.1:9")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", "from bfspo.model_io import load_config; "
                           "load_config('bfspo-tests/no-such-model')"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert time.monotonic() - start < 30
    assert proc.returncode != 0
    assert ("BfspoError: bfspo-tests/no-such-model: neither a local folder nor reachable: the hub at "
            "http://127.0.0.1:9 did not answer") in proc.stderr


def test_a_model_path_that_names_nothing_stops_the_plan_on_a_cpu_class(tmp_path):
    """GPU classes stopped the plan already (their memory plan reads config.json); CPU classes do now too."""
    from tests.test_workflow import snakemake, write_config

    def edit(c):
        c["models"]["toy-test"]["path"] = "results/toy-test/modle"

    proc = snakemake("-n", "--nolock", "--configfile", str(write_config(tmp_path, "config/test.yaml", edit)))
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "train: results/toy-test/modle: no such model directory (run toy-test_toy_dapo_s0" in output
    assert "evaluation: results/toy-test/modle: no such model directory (benchmark toy" in output


# ---- 10: two configs that name one table ----------------------------------------------------------------


def _ablation_copy(tmp_path: Path, name: str, method: str, results: Path) -> Path:
    """config/test.yaml with one method more in its table, as tmp_path/<name>.yaml, writing to `results`."""
    import yaml

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "config/test.yaml").read_text())
    cfg["results"] = str(results)
    cfg["methods"][method] = {"label": "BFS-PO", "paper": "bfspo", "k": int(method[-1])}
    cfg["tables"]["toy-test-ablation"]["methods"].append(method)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def test_a_table_built_by_one_config_is_refused_to_another_at_plan_time(tmp_path):
    """The issue's case: two copies of config/test.yaml, each with a method added, both name the table
    toy-test-ablation in one results folder. The first one's table job records its config; the second
    config's plan (a dry run) is refused, naming the table, both configs and the ways out."""
    from bfspo.reporting.owner import config_id
    from tests.test_workflow import snakemake

    results = tmp_path / "results"
    first, second = (_ablation_copy(tmp_path, n, m, results) for n, m in (("k4", "bfspo-k4"), ("k5", "bfspo-k5")))
    plan = snakemake("-n", "-p", "--forceall", "--nolock", "--configfile", str(first))
    assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-3000:]
    (table,) = [words for words in shell_commands(plan.stdout) if words[:3] == ["bfspo", "tables", "build"]]
    owner = table[table.index("--owner") + 1]
    assert owner == config_id([first])
    out_dir = table[table.index("--out-dir") + 1]
    spec = table[table.index("--spec") + 1]
    # the first config's table job, as the plan prints it (with no summaries yet: an empty table)
    assert main(["tables", "build", "--spec", spec, "--out-dir", out_dir, "--owner", owner]) == 0
    assert (results / "tables" / "toy-test-ablation.owner").read_text() == f"{owner}\n"

    refused = snakemake("-n", "--nolock", "--configfile", str(second))
    assert refused.returncode != 0
    assert (f"table toy-test-ablation: {results}/tables/toy-test-ablation.csv was built by the config {owner}, not "
            f"{config_id([second])}; both would write it. Rename the table in one of them, give one its own "
            f"`results:` folder, or delete {results}/tables/toy-test-ablation.* to hand the name to "
            f"{config_id([second])}") in refused.stdout + refused.stderr
    assert snakemake("-n", "--nolock", "--configfile", f"./{os.path.relpath(first)}").returncode == 0  # its owner


def test_each_report_is_a_new_wandb_run(tmp_path, monkeypatch):
    """A rebuilt table's report is a run of its own: never a fragment appended to the last report's id."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    csv = tmp_path / "t.csv"
    csv.write_text("Method,mean\nDAPO,1.0\n")
    ids = []
    for attempt in range(2):
        out = tmp_path / f"report{attempt}.json"
        assert main(["report", "--project", "p", "--group", "t", "--tables", str(csv), "--wandb-dir",
                     str(tmp_path / "wandb"), "--out", str(out)]) == 0
        ids.append(json.loads(out.read_text())["run_id"])
    assert ids[0] != ids[1]
