"""The toy's hash file (issue 24): SHA-256 of the data and model, and the comparison with a record."""

import hashlib
import json
import subprocess

import pytest

from bfspo.cli import main
from bfspo.errors import BfspoError
from bfspo.toy.numerics import PINNED, describe
from bfspo.toy.record import build_info, compare, file_hashes, format_record, read_record


@pytest.fixture
def built(tmp_path):
    """A stand-in toy output: data files and a model directory (the bytes do not matter here)."""
    data, model = tmp_path / "data", tmp_path / "model"
    data.mkdir(), model.mkdir()
    for name in ("train", "rl_train", "toy", "toy_ood"):
        (data / f"{name}.jsonl").write_text(f'{{"id": "{name}"}}\n')
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "tokenizer.json").write_text("{}")
    (model / "config.json").write_text('{"model_type": "qwen2"}')
    (model / ".snakemake_timestamp").write_text("")
    (model / "sft.json").write_text(json.dumps({"config": {"threads": 1, "steps": 3000}, "device": "cpu",
                                                "cpu_capability": "AVX2", "cpu_numerics": describe(PINNED),
                                                "wall_s": 12.5}))
    return data, model


def test_hashes_cover_data_and_model_but_not_the_sft_summary_or_hidden_files(built):
    data, model = built
    hashes = file_hashes(model, data)
    assert sorted(hashes) == sorted([f"{data}/{n}.jsonl" for n in ("rl_train", "toy", "toy_ood", "train")]
                                    + [f"{model}/{n}" for n in ("config.json", "model.safetensors", "tokenizer.json")])
    assert hashes[f"{model}/model.safetensors"] == hashlib.sha256(b"weights").hexdigest()
    (model / "sft.json").write_text(json.dumps({"config": {"threads": 1}, "wall_s": 99.0}))  # another wall time
    assert file_hashes(model, data) == hashes


def test_a_hash_file_reads_back_and_is_sha256sums_format(built, tmp_path):
    data, model = built
    info, hashes = build_info(model), file_hashes(model, data)
    assert info["sft_threads"] == "1" and info["sft_steps"] == "3000" and info["cpu_capability"] == "AVX2"
    assert info["cpu_numerics"] == "ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=AVX2"
    assert info["cpu_vendor"]
    path = tmp_path / "toy.sha256"
    path.write_text(format_record(info, hashes))
    assert read_record(path) == (info, hashes)
    check = subprocess.run(["sha256sum", "-c", "--quiet", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_compare_names_the_files_that_differ_and_the_kernels_behind_them(built, tmp_path):
    data, model = built
    info, hashes = build_info(model), file_hashes(model, data)
    record = tmp_path / "record.sha256"
    record.write_text(format_record(info, hashes))
    same, message = compare(record, info, hashes)
    assert same and "MATCH" in message

    (model / "model.safetensors").write_bytes(b"other weights")
    same, message = compare(record, info, file_hashes(model, data))
    assert not same and "MISMATCH: 1 of 7 files" in message and f"{model}/model.safetensors" in message
    assert "the code, the data or the installed packages differ" in message  # same CPU, torch and threads

    elsewhere = {**info, "cpu": "AMD EPYC 7B13", "cpu_capability": "AVX512"}
    same, message = compare(record, elsewhere, file_hashes(model, data))
    assert not same and "cpu AMD EPYC 7B13" in message and "cpu_capability AVX512" in message


def test_the_check_says_which_numerics_were_in_force_and_whether_bytes_matched_across_vendors(built, tmp_path):
    """Issue 36: a record made on an Intel CPU, checked on an AMD one under the same pinned numerics."""
    data, model = built
    intel = {**build_info(model), "cpu": "Intel(R) Xeon(R) Processor", "cpu_vendor": "GenuineIntel"}
    record = tmp_path / "record.sha256"
    record.write_text(format_record(intel, file_hashes(model, data)))
    amd = {**intel, "cpu": "AMD EPYC 9B14", "cpu_vendor": "AuthenticAMD"}

    same, message = compare(record, intel, file_hashes(model, data))
    assert same and "CPU numerics of this build's SFT: ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE " \
                    "ONEDNN_MAX_CPU_ISA=AVX2." in message and "vendors" not in message
    same, message = compare(record, amd, file_hashes(model, data))
    assert same and "The record's CPU is a GenuineIntel one (Intel(R) Xeon(R) Processor), this build's a " \
                    "AuthenticAMD one (AMD EPYC 9B14): the bytes matched across CPU vendors." in message

    (model / "model.safetensors").write_bytes(b"other weights")
    same, message = compare(record, amd, file_hashes(model, data))
    assert not same and "the bytes did not match across CPU vendors" in message
    assert "Only the CPU differs (AMD EPYC 9B14; record: Intel(R) Xeon(R) Processor), under the same pinned " \
           "numerics" in message
    native = {**amd, "cpu_numerics": describe({})}
    same, message = compare(record, native, file_hashes(model, data))
    assert not same and "(record: ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=AVX2)" in message
    assert "cpu_numerics ATEN_CPU_CAPABILITY=unset" in message


def test_toy_hash_prints_a_mismatch_and_exits_0(built, tmp_path, capsys):
    data, model = built
    out, record = tmp_path / "built.sha256", tmp_path / "record.sha256"
    assert main(["toy", "hash", "--model-dir", str(model), "--data-dir", str(data), "--out", str(record)]) == 0
    assert "no record to compare with" in capsys.readouterr().out
    (data / "toy.jsonl").write_text('{"id": "changed"}\n')
    assert main(["toy", "hash", "--model-dir", str(model), "--data-dir", str(data), "--out", str(out),
                 "--record", str(record)]) == 0
    printed = capsys.readouterr().out
    assert "MISMATCH: 1 of 7 files" in printed and f"{data}/toy.jsonl" in printed and "Only data files" in printed
    assert read_record(out)[1] == file_hashes(model, data)


def test_a_model_dir_without_weights_or_a_bad_record_is_a_clear_error(built, tmp_path):
    data, model = built
    (model / "model.safetensors").unlink()
    with pytest.raises(BfspoError, match="no model.safetensors"):
        file_hashes(model, data)
    bad = tmp_path / "bad.sha256"
    bad.write_text("# commit: x\nnot-a-hash  file\n")
    with pytest.raises(BfspoError, match="bad.sha256:2"):
        read_record(bad)
