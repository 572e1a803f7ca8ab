"""Issue 46: `slurm.extra` is read as sbatch reads its options, so that no other spelling of an option
set elsewhere (a unique long prefix, a short form with its value attached) gets past the refusal;
an account or qos that names several is refused, not submitted as its first."""

from __future__ import annotations

import re

import pytest

from bfspo.pipeline import slurm


def refused(extra: str) -> list[str]:
    return slurm.problems({"slurm": {"extra": extra}, "resources": {}})


@pytest.mark.parametrize("extra, named", [
    ("-t1", "'-t1' is not allowed here (sbatch reads it as --time) (use the size class's train_runtime"),
    ("-Aother", "'-Aother' is not allowed here (sbatch reads it as --account) (use slurm.account)"),
    ("--partit=long", "'--partit' is not allowed here (an abbreviation of --partition) (use slurm.partition)"),
    ("--sig=USR1@60", "'--sig' is not allowed here (an abbreviation of --signal) (bfspo sets the trainer's"),
    ("--qo=high", "'--qo' is not allowed here (an abbreviation of --qos) (use slurm.qos)"),
    ("--gpus-per-node=8", "'--gpus-per-node' is not allowed here (use slurm.gpu_type)"),
    ("--exclusive -vt 10", "'-vt' is not allowed here (sbatch reads it as --time)"),
    ("-q high", "'-q' is not allowed here (sbatch reads it as --qos)"),
    ("--mem-per-g=10G", "'--mem-per-g' is not allowed here (an abbreviation of --mem-per-gpu)"),
    ("--me=1G", "'--me' is not allowed here (an abbreviation of --mem or --mem-per-cpu or --mem-per-gpu) "
                "(use the size class's mem_mb)"),
    ("--qos=high", "'--qos' is not allowed here (use slurm.qos)"),
], ids=["t1", "Aother", "partit", "sig", "qo", "gpus-per-node", "bundled", "q", "mem-per-g", "ambiguous", "exact"])
def test_extra_refuses_an_option_set_elsewhere_under_any_sbatch_spelling(extra, named):
    assert [p for p in refused(extra) if named in p] == [p for p in refused(extra) if "not allowed" in p] != []


@pytest.mark.parametrize("extra", ["--exclusive --mail-type=END --mail-user=me@lab.org",
                                   "--wckey=x -H", "-w node1 -x node2", "--requeue --no-requeue",
                                   "--propagate=NONE", "--time-min=10", "-s"])
def test_extra_allows_options_set_nowhere_else(extra):
    assert refused(extra) == []


def test_every_option_the_plugin_refuses_is_refused_by_its_long_name():
    """The plugin's own list (`get_forbidden_slurm_options`) is covered: a plugin update that refuses
    another option shows here."""
    from snakemake_executor_plugin_slurm.validation import get_forbidden_slurm_options

    names = {m for pattern in get_forbidden_slurm_options() for m in re.findall(r"--([a-z-]+)", pattern)}
    shorts = {m for pattern in get_forbidden_slurm_options() for m in re.findall(r"\|-([A-Za-z])", pattern)}
    assert names <= set(slurm.REFUSED) and shorts <= set(slurm.SHORT_LONG)


@pytest.mark.parametrize("where, block", [
    ("slurm.account", {"account": "lab,other"}),
    ("slurm.qos", {"qos": "normal,high"}),
    ("slurm.cpu.account", {"cpu": {"account": "lab,other"}}),
    ("slurm.sizes.8b.account", {"sizes": {"8b": {"account": "a,b"}}}),
])
def test_an_account_or_qos_naming_several_is_refused(where, block):
    problems = slurm.problems({"slurm": block, "resources": {"8b": {}}})
    assert any(p.startswith(f"{where}: ") and "names more than one" in p for p in problems), problems
    assert slurm.problems({"slurm": {"account": "lab", "qos": "high", "partition": "a,b"}, "resources": {}}) == []
