"""Issue 45 §5, runs that know their code: every run and evaluation records the commit, a dirty flag and a
fingerprint of the code that shapes it (bfspo/code_identity.py); the dry run and the tables name those
made with other code than the checkout's, and nothing reruns them silently."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from bfspo import code_identity
from bfspo.cli import main
from bfspo.code_identity import identity, source_fingerprint, stale
from bfspo.io import read_json

OTHER = {"commit": "0123456789abcdef" * 2 + "01234567", "dirty": True, "source_sha256": "0" * 64, "scope": "train"}


@pytest.fixture
def package(tmp_path) -> Path:
    """A copy of the bfspo package outside any git checkout, as an sdist or a wheel installs it."""
    copy = tmp_path / "src" / "bfspo"
    shutil.copytree(code_identity.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _edit(path: Path) -> None:
    path.write_text(path.read_text() + "\n# an edit\n")


def test_the_fingerprint_covers_the_code_that_shapes_each_scope_and_nothing_else(package):
    """Editing an existing advantage function changed nothing that a run records; now it changes both
    fingerprints, the trainer's only the training one, the evaluation's only the evaluation one, and a
    table's code neither. The same bytes anywhere give the same fingerprint."""
    before = {scope: source_fingerprint(scope, package) for scope in code_identity.SCOPES}
    assert before == {scope: source_fingerprint(scope) for scope in code_identity.SCOPES}
    changed = {}
    for edited in ("reporting/tables.py", "training/trainer.py", "evaluation/evaluate.py", "algorithm/advantages.py",
                   "tasks/verify.py"):
        _edit(package / edited)
        now = {scope: source_fingerprint(scope, package) for scope in code_identity.SCOPES}
        changed[edited] = sorted(s for s in now if now[s] != before[s])
        before = now
    assert changed == {"reporting/tables.py": [], "training/trainer.py": ["train"],
                       "evaluation/evaluate.py": ["evaluate"], "algorithm/advantages.py": ["evaluate", "train"],
                       "tasks/verify.py": ["evaluate", "train"]}
    (package / "rollout" / "new_engine.py").write_text("")
    assert source_fingerprint("train", package) != before["train"]


def test_without_git_the_commit_is_unknown(package, monkeypatch):
    assert identity("train", package) == {"commit": "unknown", "dirty": None,
                                          "source_sha256": source_fingerprint("train", package), "scope": "train"}
    monkeypatch.setenv("PATH", "/nonexistent")  # no git at all
    assert identity("evaluate")["commit"] == "unknown"


def test_in_a_checkout_the_commit_and_whether_the_package_differs_from_it(package):
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(package.parent), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "code")
    assert identity("train", package) | {"source_sha256": ""} == {
        "commit": git("rev-parse", "HEAD"), "dirty": False, "source_sha256": "", "scope": "train"}
    (package.parent / "notes.txt").write_text("outside the package")
    assert identity("train", package)["dirty"] is False
    (package / "reporting" / "new.py").write_text("")
    assert identity("train", package)["dirty"] is True


def test_stale_names_the_records_made_with_other_code(tmp_path):
    records = {}
    for name, code in (("same", identity("train")), ("other", OTHER), ("before-code", None)):
        path = records[name] = tmp_path / name / "done.json"
        path.parent.mkdir()
        path.write_text(json.dumps({"steps": 1} | ({"code": code} if code else {})))
    records["missing"] = tmp_path / "missing" / "done.json"
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "done.json").write_text('{"code"')
    records["torn"] = tmp_path / "torn" / "done.json"
    assert stale(records, "train") == {"other": "commit 01234567 (dirty)"}
    assert code_identity.stale_line(stale(records, "train"), "training run") == (
        "1 training run made with other code than this checkout's (bfspo/code_identity.py): other (commit 01234567 "
        "(dirty))")
    assert code_identity.stale_line({}, "training run") is None


def test_an_evaluation_records_its_code(tiny_model_dir, tmp_path):
    data = tmp_path / "gsm8k.jsonl"
    data.write_text(json.dumps({"id": "q0", "question": "Tom has 1 apple and buys 3 more. How many?", "answer": "4"})
                    + "\n")
    out = tmp_path / "eval"
    assert main(["evaluate", "--model", str(tiny_model_dir), "--benchmark", "gsm8k", "--data", str(data),
                 "--out-dir", str(out), "--budget", "4", "--batch-size", "4"]) == 0
    assert read_json(out / "summary.json")["code"] == identity("evaluate")


def test_a_table_names_its_runs_made_with_other_code(tmp_path):
    from tests.test_tables import SPEC, summary

    runs = [summary(tmp_path, "m_zero-shot", "zero-shot", 80.0, 200.0),
            summary(tmp_path, "m_ts_dapo_s0", "dapo", 82.0, 180.0),
            summary(tmp_path, "m_ts_glob_s0", "glob", 76.0, 160.0)]
    for path, code in zip(runs, (identity("evaluate"), OTHER | {"scope": "evaluate"}, None)):
        Path(path).write_text(json.dumps(read_json(path) | ({"code": code} if code else {})))
    (tmp_path / "runs" / "m_ts_glob_s0").mkdir(parents=True)
    (tmp_path / "runs" / "m_ts_glob_s0" / "done.json").write_text(json.dumps({"code": OTHER}))
    args = ["tables", "build", "--spec", json.dumps(SPEC), "--summaries", *runs, "--out-dir", str(tmp_path / "out")]
    assert main(args) == 0
    table = (tmp_path / "out" / "abl.md").read_text()
    assert ("\nOther code: 1 evaluation made with other code than this checkout's (bfspo/code_identity.py): "
            "m_ts_dapo_s0/b (commit 01234567 (dirty))\n") in table
    assert main(args + ["--runs-dir", str(tmp_path / "runs")]) == 0
    assert "1 training run made with other code than this checkout's (bfspo/code_identity.py): m_ts_glob_s0 " \
           "(commit 01234567 (dirty))" in (tmp_path / "out" / "abl.md").read_text()
    Path(runs[1]).write_text(json.dumps(read_json(runs[1]) | {"code": identity("evaluate")}))
    assert main(args) == 0
    assert "Other code" not in (tmp_path / "out" / "abl.md").read_text()


def test_the_dry_run_names_the_runs_made_with_other_code(tmp_path):
    """Snakemake tracks the rules' code, not the package's: after an edit of an advantage function it
    said "Nothing to be done" of the finished runs without a word. Now the dry run names them, and how
    to rerun them (a rerun is the user's decision, docs/workflow.md)."""
    from bfspo.pipeline.matrix import Matrix, load_config
    from tests.test_workflow import dry_run, write_config

    config = write_config(tmp_path, "config/config.yaml", lambda cfg: None, own_results=True)
    matrix = Matrix(load_config(config))
    run = next(iter(matrix.runs))
    done = Path(matrix.results) / "runs" / run / "done.json"
    done.parent.mkdir(parents=True)
    done.write_text(json.dumps({"steps": 1, "code": OTHER}))
    out = dry_run("--configfile", str(config))
    assert (f"1 training run made with other code than this checkout's (bfspo/code_identity.py): {run} "
            "(commit 01234567 (dirty))") in out
    assert f"delete its folder ({matrix.results}/runs/<run>/ or " in out
    done.write_text(json.dumps({"steps": 1, "code": identity("train")}))
    assert "other code" not in dry_run("--configfile", str(config))
