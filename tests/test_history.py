"""Issue 39, findings 1, 4, 5 and 8: an earlier run or evaluation set aside survives a kill at any step,
keeps its own W&B run and stays until the user deletes it; a killed write's temporary file is removed at
the next start."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from bfspo import history
from bfspo.cli import main
from bfspo.io import read_json
from bfspo.training.run_dir import prepare_run_dir, run_entries, set_aside

QUESTIONS = [{"id": f"q{i}", "question": f"Tom has {i} apples and buys 3 more. How many?", "answer": str(i + 3)}
             for i in range(3)]


REAL_MOVE = history._move


class Killed(BaseException):
    """A kill at a fault point: nothing in bfspo catches it, so no cleanup runs after it."""


def files(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every file under `folder` (but the top-level entries `skip`): relative path -> SHA-256."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.relative_to(folder).parts[0] not in skip}


def kill_at_move(monkeypatch, k: int) -> list:
    """Make the (k+1)-th rename of a set-aside a kill; the renames made before it, returned."""
    move, made = history._move, []

    def killed(src, dst):
        if len(made) == k:
            raise Killed
        move(src, dst)
        made.append(src)

    monkeypatch.setattr(history, "_move", killed)
    return made


@pytest.fixture(scope="module")
def finished_run(tiny_model_dir, train_data, tmp_path_factory) -> Path:
    """A finished one-step run with trees, and the W&B id and run folder an offline run leaves."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(["train", "--output-dir", str(out), "--set", f"model={tiny_model_dir}", f"train_data={train_data}",
                 "benchmark=gsm8k_train", "k=1", "group_size=4", "budget=12", "steps=1", "train_batch=8",
                 "mini_batch=8", "lr=1e-2", "log_trees=2", "max_empty_steps=50", "threads=1",
                 "wandb_mode=disabled"]) == 0
    (out / "wandb_id.txt").write_text("abc123\n")
    (out / "wandb" / "offline-run-20260101_000000-abc123").mkdir(parents=True)
    (out / "wandb" / "offline-run-20260101_000000-abc123" / "run-abc123.wandb").write_bytes(b"W&B records")
    (out / "train.log").write_text("the job's log\n")
    return out


def _records(run_dir: Path, data_sha: str):
    """The run's config, and inputs whose training data changed content (`data_sha`)."""
    from bfspo.training.config import TrainConfig

    inputs = read_json(run_dir / "inputs.json")
    (name,) = inputs["train_data"]
    return TrainConfig(**read_json(run_dir / "config.json")), inputs | {"train_data": {name: data_sha}}


def start(cfg, run_dir: Path, inputs: dict) -> bool:
    """A start of `bfspo train` up to its training, once its inputs have loaded: the earlier run set
    aside if its inputs changed; whether there is a run to train."""
    found = prepare_run_dir(cfg, run_dir, inputs)
    if found.changed:
        set_aside(run_dir, found.changed)
    return not found.finished


RUN_PARTS = ("train.log", ".bfspo.lock", "previous")  # what is not the run's (run_dir.KEPT)


def test_a_kill_after_any_step_of_a_set_aside_loses_nothing_and_the_next_start_finishes_it(finished_run, tmp_path,
                                                                                              monkeypatch, capsys):
    """The probe's SIGKILL after the third entry moved, then the same command: adapter/, metrics.jsonl
    and trees/ were gone, deleted with the previous/ that each start replaced. Here the set-aside is
    killed after each of its steps in turn (creating the staging folder, each entry's rename, the
    staging folder's rename), and the next start finds every byte of the old run in previous/1."""
    cfg, inputs = _records(finished_run, "0" * 64)
    entries = run_entries(finished_run)
    assert {"adapter", "checkpoint", "config.json", "done.json", "inputs.json", "metrics.jsonl", "trees", "wandb",
            "wandb_id.txt"} <= set(entries)
    old = files(finished_run, RUN_PARTS)
    assert any(name.startswith("trees/") for name in old) and any(name.startswith("adapter/") for name in old)
    for k in range(len(entries) + 2):  # a kill at the k+1-th rename; the last k: none, the set-aside ended
        run_dir = tmp_path / f"kill{k}"
        shutil.copytree(finished_run, run_dir)
        made = kill_at_move(monkeypatch, k)
        try:
            assert start(cfg, run_dir, inputs)
        except Killed:
            assert len(made) == k
        monkeypatch.setattr(history, "_move", REAL_MOVE)
        staging = run_dir / "previous" / history.STAGING_NAME
        left = files(run_dir, RUN_PARTS) | files(staging) | (files(run_dir / "previous/1")
                                                               if (run_dir / "previous/1").exists() else {})
        assert left == old, f"kill at rename {k + 1}: bytes of the old run lost"
        assert start(cfg, run_dir, inputs), "the next start trains afresh"
        assert sorted(p.name for p in run_dir.iterdir()) == [".bfspo.lock", "previous", "train.log"]
        assert sorted(p.name for p in (run_dir / "previous").iterdir()) == ["1"]
        assert files(run_dir / "previous/1") == old
    out = capsys.readouterr().out
    assert f"{tmp_path / 'kill1'}: finished moving an earlier run to {tmp_path / 'kill1/previous/1'}, which a kill " \
           "had interrupted" in out


def test_bfspo_train_finishes_an_interrupted_set_aside_and_trains(finished_run, tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    cfg, inputs = _records(run_dir, "0" * 64)
    old = files(run_dir, RUN_PARTS)
    kill_at_move(monkeypatch, 4)
    with pytest.raises(Killed):
        start(cfg, run_dir, inputs)
    monkeypatch.setattr(history, "_move", REAL_MOVE)
    capsys.readouterr()
    config = read_json(finished_run / "config.json")
    assert main(["train", "--output-dir", str(run_dir), "--set",
                 *[f"{k}={json.dumps(v)}" for k, v in config.items() if v is not None]]) == 0
    assert "finished moving an earlier run" in capsys.readouterr().out
    assert files(run_dir / "previous/1") == old
    assert read_json(run_dir / "done.json")["steps"] == 1 and not (run_dir / "wandb_id.txt").exists()


def test_every_earlier_run_is_kept_with_its_own_wandb_run_and_the_message_names_a_finished_one(finished_run, tmp_path,
                                                                                               capsys):
    """The probe's second input change deleted the first finished run and its never-synced W&B run
    without a word: previous/ was replaced."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    (run_dir / "previous").mkdir()
    (run_dir / "previous" / "done.json").write_text("{}\n")  # a set-aside of an older bfspo, loose in previous/
    first = files(run_dir, RUN_PARTS)
    cfg, inputs = _records(run_dir, "1" * 64)
    assert start(cfg, run_dir, inputs)
    assert (f"{run_dir}: its inputs changed since the run there was made (train_data (train.jsonl)): moved that run, "
            f"a finished run (done.json, adapter/) and its W&B run abc123, to {run_dir / 'previous/1'}, where it "
            "stays until you delete it; training from step 0") in capsys.readouterr().out
    for name in run_entries(finished_run):  # the second run, finished, with a W&B run of its own
        (shutil.copytree if (finished_run / name).is_dir() else shutil.copy)(finished_run / name, run_dir / name)
    (run_dir / "wandb_id.txt").write_text("def456\n")
    (run_dir / "inputs.json").write_text(json.dumps(inputs))
    second = files(run_dir, RUN_PARTS)
    cfg, inputs = _records(run_dir, "2" * 64)
    assert start(cfg, run_dir, inputs)
    assert "a finished run (done.json, adapter/) and its W&B run def456, to " \
           f"{run_dir / 'previous/2'}" in capsys.readouterr().out
    assert files(run_dir / "previous/1") == first and files(run_dir / "previous/2") == second
    assert (run_dir / "previous" / "done.json").read_text() == "{}\n"  # never touched


def _evaluate(model_dir, data, out, *extra) -> int:
    return main(["evaluate", "--model", str(model_dir), "--benchmark", "gsm8k", "--data", str(data),
                 "--out-dir", str(out), "--budget", "8", "--batch-size", "8", *extra])


def test_a_reevaluation_moves_the_earlier_wandb_run_with_its_results(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The probe's re-evaluation reused the earlier evaluation's W&B id: `bfspo sync --list` showed one run
    of two fragments, the old evaluation's and the new one's."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in QUESTIONS))
    results = tmp_path / "results"
    out = results / "eval" / "run" / "gsm8k"
    assert _evaluate(tiny_model_dir, data, out, "--wandb-project", "p") == 0
    first = files(out, (".bfspo.lock",))
    first_id = (out / "wandb_id.txt").read_text()
    assert _evaluate(tiny_model_dir, data, out, "--wandb-project", "p", "--budget", "6") == 0
    assert (f"moved the summary.json, samples.jsonl, wandb_id.txt and wandb of an earlier evaluation (other budget) "
            f"to {out / 'previous/1'}") in capsys.readouterr().out
    core_log = lambda found: {k: v for k, v in found.items() if not k.endswith("debug-core.log")}  # noqa: E731
    assert core_log(files(out / "previous/1")) == core_log(first)  # wandb's service still appends to its log
    assert (out / "wandb_id.txt").read_text() != first_id
    assert main(["sync", str(results), "--list"]) == 0
    (line,) = capsys.readouterr().out.splitlines()[1:]
    _, project, _, fragments, _, folder = line.split("\t")
    assert (project, fragments, folder) == ("p", "1", str(out / "wandb"))


def test_an_interrupted_reevaluation_set_aside_is_finished_at_the_next_start(tiny_model_dir, tmp_path, monkeypatch,
                                                                             capsys):
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in QUESTIONS))
    out = tmp_path / "eval"
    assert _evaluate(tiny_model_dir, data, out) == 0
    first = files(out, (".bfspo.lock",))
    kill_at_move(monkeypatch, 1)  # summary.json moved, samples.jsonl not yet
    with pytest.raises(Killed):
        _evaluate(tiny_model_dir, data, out, "--budget", "6")
    assert not (out / "summary.json").exists()  # nothing looks finished
    monkeypatch.setattr(history, "_move", REAL_MOVE)
    assert _evaluate(tiny_model_dir, data, out, "--budget", "6") == 0
    assert f"{out}: finished moving an earlier evaluation to {out / 'previous/1'}" in capsys.readouterr().out
    assert files(out / "previous/1") == first and read_json(out / "summary.json")["budget"] == 6


def test_the_temporary_files_of_killed_writes_are_removed_at_the_next_start(finished_run, tiny_model_dir, tmp_path):
    """The probe's kill during the final writes left `.done.json.<random>.tmp` in the run directory."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    strays = [run_dir / ".done.json.k3j2h1.tmp", run_dir / ".metrics.jsonl.x8y7.tmp",
              run_dir / "trees" / ".step_00001.jsonl.q1w2.tmp"]
    for path in strays:
        path.write_text('{"steps": 1')
    config = read_json(finished_run / "config.json")
    assert main(["train", "--output-dir", str(run_dir), "--set",
                 *[f"{k}={json.dumps(v)}" for k, v in config.items() if v is not None]]) == 0  # already finished
    assert not any(path.exists() for path in strays)
    assert (run_dir / "done.json").exists() and (run_dir / "trees").is_dir()

    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in QUESTIONS))
    out = tmp_path / "eval"
    assert _evaluate(tiny_model_dir, data, out) == 0
    stray = out / ".summary.json.a1b2c3.tmp"
    stray.write_text("{")
    assert _evaluate(tiny_model_dir, data, out) == 0  # already done
    assert not stray.exists()


def _gone(pid: int, within: float = 30.0) -> bool:
    """Whether process `pid` ended (gone, or a zombie not reaped yet) within `within` seconds."""
    import time

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


def test_a_command_that_a_test_gives_up_on_is_killed_with_its_children(tmp_path):
    """Finding 8: a timed-out `make test-vllm` left vLLM's engine-core process orphaned, since
    subprocess.run's timeout kills the child it started, not that child's children. The tests start
    `bfspo train`, `bfspo evaluate`, torchrun and Snakemake through tests/helpers/process.py."""
    import subprocess
    import time

    from tests.helpers import process

    pid_file = tmp_path / "grandchild"
    command = ["sh", "-c", f"sleep 300 & echo $! > {pid_file}; wait"]
    with pytest.raises(subprocess.TimeoutExpired):
        process.run(command, timeout=5)
    assert _gone(int(pid_file.read_text()))
    pid_file.unlink()
    with process.started(command) as proc:
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert proc.poll() is None
            time.sleep(0.01)
    assert _gone(int(pid_file.read_text()))


def test_the_run_directory_code_and_these_tests_import_no_torch():
    """Issue 48 §3: the run directory's lifecycle (bfspo/training/run_dir.py) and the code identity
    need no torch, nor do these tests to reach them (the fixtures that train load it, as pytest's
    conftest does)."""
    import subprocess
    import sys

    check = ("import sys; import bfspo.training.run_dir, bfspo.code_identity, tests.test_history; "
             "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr


def _train_again(run_dir: Path, **changed) -> int:
    config = read_json(run_dir / "config.json") | changed
    return main(["train", "--output-dir", str(run_dir), "--set",
                 *[f"{k}={json.dumps(v)}" for k, v in config.items() if v is not None]])


def test_a_bad_new_data_file_leaves_the_finished_run_in_place(finished_run, train_data, tmp_path, capsys):
    """Issue 46 item 7: a start on a bad new data file moved the finished run aside before the file was
    read, so putting the old data back retrained from step 0. The new inputs are checked first."""
    run_dir, data = tmp_path / "run", tmp_path / "data" / "train.jsonl"
    shutil.copytree(finished_run, run_dir)
    data.parent.mkdir()
    shutil.copy(train_data, data)
    config = read_json(run_dir / "config.json") | {"train_data": str(data)}
    (run_dir / "config.json").write_text(json.dumps(config))
    old = files(run_dir, RUN_PARTS)
    data.write_text('{"id": "0", "question": "Tom has 0 apples"}\n')  # no answer: the rows are refused
    assert _train_again(run_dir) == 2
    assert "answer" in capsys.readouterr().err
    assert files(run_dir, RUN_PARTS) == old and not (run_dir / "previous").exists()
    shutil.copy(train_data, data)
    assert _train_again(run_dir) == 0
    assert "already finished" in capsys.readouterr().out
    assert files(run_dir, RUN_PARTS) == old


def test_a_resume_whose_metrics_lost_their_rows_keeps_the_checkpoints_step(finished_run, tmp_path, capsys):
    """Issue 46 (Low): with metrics.jsonl emptied, the resume from the checkpoint at the last step said
    that nothing was trained. The checkpoint's step stands, and the lost rows are named."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    shutil.rmtree(run_dir / "adapter")
    (run_dir / "done.json").unlink()
    (run_dir / "metrics.jsonl").write_text("")
    assert _train_again(run_dir) == 0
    out = capsys.readouterr().out
    assert (f"{run_dir / 'metrics.jsonl'}: the rows of 1 of the 1 steps that the checkpoint holds are lost (steps 1); "
            "the checkpoint's step 1 stands") in out
    assert read_json(run_dir / "done.json")["steps"] == 1 and (run_dir / "adapter").is_dir()


def test_spans_names_runs_of_steps():
    from bfspo.training.run_dir import spans

    assert spans([1, 2, 3, 5, 7, 8]) == "1-3, 5, 7-8" and spans([4]) == "4" and spans([]) == ""


@pytest.mark.parametrize("name", ["²", "٣", "1.5", "x"])
def test_only_ascii_numbers_in_previous_are_set_aside_slots(tmp_path, name):
    """Issue 46 item 10: a folder previous/² gave a ValueError traceback from int() and left the run
    half-moved, and every later start failed the same way. Such a folder is not a slot: left alone."""
    (tmp_path / "done.json").write_text("{}")
    (tmp_path / "previous" / name).mkdir(parents=True)
    (tmp_path / "previous" / "2").mkdir()
    assert history.set_aside(tmp_path, ["done.json"]) == tmp_path / "previous" / "3"
    assert (tmp_path / "previous" / name).is_dir() and (tmp_path / "previous" / "3" / "done.json").is_file()
    (tmp_path / "done.json").write_text("{}")  # an interrupted move: the staging folder is completed
    (tmp_path / "previous" / history.STAGING_NAME).mkdir()
    assert history.finish_set_aside(tmp_path, lambda: ["done.json"]) == tmp_path / "previous" / "4"


def test_a_set_aside_says_how_many_runs_and_bytes_previous_holds(tmp_path, capsys):
    """Issue 46 (Low): previous/ grew without a word. Each set-aside says, on one line, how many earlier
    runs (numbered folders) and bytes previous/ now holds."""
    run_dir = tmp_path / "run"
    (run_dir / "adapter").mkdir(parents=True)
    (run_dir / "adapter" / "adapter_model.safetensors").write_bytes(b"w" * 3000)
    (run_dir / "done.json").write_text("{}")
    set_aside(run_dir, ["train_data (train.jsonl)"])
    (run_dir / "done.json").write_text('{"steps": 1}')
    set_aside(run_dir, ["train_data (train.jsonl)"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == f"{run_dir / 'previous'} now holds 1 earlier run, 3,002 bytes (0.0 MiB); nothing there is " \
                       "deleted but by you"
    assert lines[3].startswith(f"{run_dir / 'previous'} now holds 2 earlier runs, 3,014 bytes")


def test_a_finished_run_records_the_code_that_trained_it(finished_run):
    """Issue 45 §5: the commit was in the W&B run file only. done.json records the commit, whether the
    package differed from it, and the fingerprint of the code that shapes training."""
    from bfspo.code_identity import identity

    assert read_json(finished_run / "done.json")["code"] == identity("train")
