"""`bfspo train --help` lists every TrainConfig key with its default and help text."""

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
