"""The toy's shipped start model (issue 44): export, the checks of install, and what the toy check says."""

import subprocess
from pathlib import Path

import pytest

from bfspo.cli import main
from bfspo.errors import BfspoError
from bfspo.toy.record import PROVENANCE, file_hashes, read_record, write_and_check
from bfspo.toy.shipped import export, install, verify
from tests.test_toy_record import built  # noqa: F401 (the stand-in toy output)

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "data/toy-model"
COMMAND = "snakemake --cores 2 --configfile config/config.yaml (toy.build: true)"


@pytest.fixture
def shipped(built, tmp_path):  # noqa: F811
    data, model = built
    (model / ".snakemake_timestamp").unlink()
    folder = tmp_path / "shipped"
    export(model, folder, "default", COMMAND)
    return data, model, folder


def test_export_writes_the_files_and_a_provenance_that_pins_them(shipped):
    data, model, folder = shipped
    info, hashes = read_record(folder / PROVENANCE)
    assert info["command"] == COMMAND and info["size"] == "default" and info["cpu"] and info["commit"]
    assert info["cpu_numerics"] == "ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=AVX2"
    assert sorted(Path(p).name for p in hashes) == ["config.json", "model.safetensors", "sft.json", "tokenizer.json"]
    check = subprocess.run(["sha256sum", "-c", "--quiet", str(folder / PROVENANCE)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_install_copies_the_same_bytes_and_the_check_says_the_start_was_shipped(shipped, tmp_path):
    data, model, folder = shipped
    record = tmp_path / "record.sha256"
    write_and_check(model, data, record, None)
    out = tmp_path / "results/model"
    assert "no SFT ran" in install(folder, out, "default")
    assert sorted(file_hashes(out, data).values()) == sorted(file_hashes(model, data).values())
    assert out.stat().st_mode & 0o777 == 0o755
    rebuilt = write_and_check(model, data, tmp_path / "again.sha256", record)
    assert "toy check: MATCH" in rebuilt and "Start model: rebuilt by this run's SFT" in rebuilt
    # the record's paths name the DAG's model directory: the copy takes its place
    model.rename(tmp_path / "built-model")
    out.rename(model)
    message = write_and_check(model, data, tmp_path / "out.sha256", record)
    assert read_record(tmp_path / "out.sha256")[0]["start"] == "shipped"
    assert "toy check: MATCH" in message and f"Start model: shipped: copied from its tracked folder, built by " \
                                              f"`{COMMAND}`" in message and "no SFT ran" in message


@pytest.mark.parametrize("edit, error", [
    (lambda f: (f / "model.py").write_text("import os"), "only .jinja, .json, .safetensors files may be shipped"),
    (lambda f: (f / "pytorch_model.bin").write_bytes(b"pickle"), "nothing that runs code"),
    (lambda f: (f / "model.safetensors").write_bytes(b"tampered"), "does not have the SHA-256"),
    (lambda f: (f / "extra.json").write_text("{}"), "not listed: extra.json"),
    (lambda f: (f / "tokenizer.json").unlink(), "missing: tokenizer.json"),
    (lambda f: (f / PROVENANCE).unlink(), "no PROVENANCE.sha256"),
    (lambda f: (f / "sub").mkdir(), "not a plain file"),
], ids=["python", "pickle", "tampered", "unlisted", "missing", "no-provenance", "subfolder"])
def test_install_refuses_a_folder_that_could_run_code_or_was_changed(shipped, tmp_path, edit, error):
    data, model, folder = shipped
    edit(folder)
    out = tmp_path / "results/model"
    with pytest.raises(BfspoError, match=error):
        install(folder, out, "default")
    assert not out.exists() and not list(out.parent.glob(".model.*"))


def test_install_refuses_another_size_and_the_cli_exits_non_zero(shipped, tmp_path, capsys):
    data, model, folder = shipped
    out = tmp_path / "results/model"
    assert main(["toy", "install", "--shipped", str(folder), "--out-dir", str(out), "--size", "test"]) != 0
    assert "size 'default', the config asks for 'test': set toy.build: true" in capsys.readouterr().err
    assert not out.exists()


def test_the_tracked_start_model_checks_and_git_keeps_it():
    """data/toy-model: safetensors, JSON and Jinja files, each with its PROVENANCE hash, a model of
    the default size, with the command, CPU, date and commit that built it; no ignore rule hides them."""
    info = verify(SHIPPED, "default")
    assert info["size"] == "default" and "bfspo toy build" in info["command"]
    assert all(info[k] for k in ("commit", "cpu", "date", "cpu_numerics"))
    files = [str(p.relative_to(ROOT)) for p in SHIPPED.iterdir()]
    assert "data/toy-model/model.safetensors" in files and "data/toy-model/PROVENANCE.sha256" in files
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *files], cwd=ROOT, capture_output=True, text=True)
    assert ignored.returncode == 1 and not ignored.stdout, ignored.stdout
