"""`bfspo train --help` lists every TrainConfig key with its default and help text; `bfspo train` and
`bfspo evaluate` report a mistake in their arguments before they import torch (issue 37)."""

import subprocess
import sys
from dataclasses import fields

import pytest

from bfspo import cli
from bfspo.training.config import TrainConfig


def test_train_help_lists_every_key_with_its_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for f in fields(TrainConfig):
        assert f"\n  {f.name} (" in out, f.name
        assert " ".join(f.metadata["help"].split()[:4]) in " ".join(out.split()), f.name
    assert "  log_trees (int; default 8)" in out and "  model (str; required)" in out


# ---- argument errors before torch (issue 37) ----------------------------------------------------------

# Runs `bfspo ARGS` in a fresh interpreter and says whether torch was imported by the time it exited.
_MAIN = """
import sys
from bfspo import cli
try:
    code = cli.main(sys.argv[1:])
except SystemExit as e:
    code = e.code
print("torch imported:", "torch" in sys.modules)
sys.exit(code)
"""


def bfspo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _MAIN, *args], capture_output=True, text=True, timeout=120)


def test_the_command_modules_and_the_config_import_no_torch():
    """The one list of keys (TrainConfig's fields) is read without torch, so arguments are checked first."""
    code = ("import sys, bfspo.training.config, bfspo.training.cli, bfspo.evaluation.cli, bfspo.cli; "
            "print(sorted(m for m in ('torch', 'transformers', 'vllm', 'bfspo.training.trainer', "
            "'bfspo.evaluation.evaluate') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("args, says", [
    (["--set", "stesp=5"], "argument --set: unknown key 'stesp'; did you mean 'steps'? (every key, with its "
                           "default and meaning: bfspo train --help, or config/README.md, section train)"),
    (["--set", "steps", "--output-dir", "o"], "argument --set: 'steps' is not of the form KEY=VALUE"),
    (["--steps", "5", "--output-dir", "o"], "--steps: TrainConfig fields go through --set: --set steps=5"),
    (["--output-dir", "o", "--group-size=4"], "--group-size: TrainConfig fields go through --set: --set group_size=4"),
    (["--set", "model=m", "train_data=d", "lr=fast", "--output-dir", "o"], "config: lr must be a number"),
], ids=["unknown-key", "no-value", "field-as-option", "field-as-option-with-equals", "bad-value"])
def test_train_argument_errors_come_before_torch(args, says):
    out = bfspo("train", *args)
    assert out.returncode == 2 and says in out.stderr, out.stderr
    assert "torch imported: False" in out.stdout
    assert "wandb_project" not in out.stderr  # a pointer to where the keys are described, not all of them


@pytest.mark.parametrize("args, says", [
    (["--benchmark", "gsm9k"], "unknown benchmark 'gsm9k'"),
    (["--benchmark", "gsm8k", "--samples", "4", "--temperature", "0"], "4 samples per question at temperature 0"),
    (["--benchmark", "gsm8k", "--batch-size", "0"], "--batch-size, --limit and --threads must be positive"),
], ids=["unknown-benchmark", "greedy-samples", "batch-size"])
def test_evaluate_argument_errors_come_before_torch(tmp_path, args, says):
    out = bfspo("evaluate", "--model", "m", "--data", "d.jsonl", "--out-dir", str(tmp_path / "out"), *args)
    assert out.returncode == 2 and says in out.stderr, out.stderr
    assert "torch imported: False" in out.stdout and not (tmp_path / "out").exists()
