"""SHA-256 of the toy's data and model, and their comparison with a recorded set (issue 24).

The toy's bytes are reproducible bit for bit only where the CPU kernels are the same: the same
kernels (torch's CPU capability, MKL's code path and oneDNN's, which the toy pins for every x86-64
CPU with AVX2: bfspo/toy/numerics.py), the same torch build and the same SFT thread count
(docs/reproducibility.md). A hash file therefore says, in its header, what made it: the CPU and
its vendor, and the numerics the SFT ran under; the comparison says whether the bytes matched
across CPU vendors, and a mismatch names what differs.

A hash file is `sha256sum`'s format (`sha256sum -c FILE` checks it from the repository root) after
`# key: value` header lines.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import subprocess
from pathlib import Path

from bfspo.errors import BfspoError
from bfspo.io import atomic_write_text

PROVENANCE = "PROVENANCE.sha256"  # a shipped start model's record of what made it (bfspo/toy/shipped.py)
UNHASHED = frozenset({"sft.json", PROVENANCE})  # the SFT's summary holds its wall time
# What the model's bytes depend on beyond the code and the data; a mismatch names those that differ.
KERNEL_KEYS = ("cpu", "cpu_capability", "cpu_numerics", "torch", "sft_threads", "sft_device")
UNKNOWN = "unknown (not in sft.json)"  # a model built before sft.json recorded its CPU numerics


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_hashes(model_dir: str | Path, data_dir: str | Path) -> dict[str, str]:
    """{path: SHA-256} of the data's JSONL files and every file of the model directory but sft.json
    and hidden ones (Snakemake's timestamp); paths as given (relative to the repository root in the DAG)."""
    model_dir, data_dir = Path(model_dir), Path(data_dir)
    for d in (model_dir, data_dir):
        if not d.is_dir():
            raise BfspoError(f"toy hash: no directory {d}")
    files = sorted(data_dir.glob("*.jsonl")) + sorted(
        p for p in model_dir.iterdir() if p.is_file() and p.name not in UNHASHED and not p.name.startswith("."))
    if not (model_dir / "model.safetensors").is_file():
        raise BfspoError(f"toy hash: {model_dir} has no model.safetensors")
    return {p.as_posix(): sha256(p) for p in files}


def _commit() -> str:
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], capture_output=True,
                             text=True, timeout=30)
    except OSError:
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def _cpuinfo(field: str) -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == field:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _cpu_model() -> str:
    import platform

    return _cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_vendor() -> str:
    """The CPU's vendor id (GenuineIntel, AuthenticAMD, ...), or `unknown`."""
    return _cpuinfo("vendor_id") or "unknown"


def build_info(model_dir: str | Path) -> dict[str, str]:
    """What made the model: commit, date, CPU type and vendor, torch, and from the model's sft.json
    the CPU capability and numerics the SFT ran under and its threads, steps and device. For a
    shipped start model (a PROVENANCE file in `model_dir`), PROVENANCE's header: what made it where
    it was built."""
    import torch

    if (Path(model_dir) / PROVENANCE).is_file():
        return read_record(Path(model_dir) / PROVENANCE)[0]
    sft_path = Path(model_dir) / "sft.json"
    try:
        sft = json.loads(sft_path.read_text())
    except (OSError, ValueError) as e:
        raise BfspoError(f"toy hash: cannot read {sft_path}: {e}") from None
    cfg = sft.get("config", {})
    return {
        "commit": _commit(),
        "date": datetime.date.today().isoformat(),
        "cpu": _cpu_model(),
        "cpu_vendor": cpu_vendor(),
        "cpu_capability": str(sft.get("cpu_capability", UNKNOWN)),
        "cpu_numerics": str(sft.get("cpu_numerics", UNKNOWN)),
        "torch": torch.__version__,
        "sft_threads": str(cfg.get("threads")),
        "sft_steps": str(cfg.get("steps")),
        "sft_device": str(sft.get("device")),
    }


def format_record(info: dict[str, str], hashes: dict[str, str]) -> str:
    head = "".join(f"# {key}: {value}\n" for key, value in info.items())
    return head + "".join(f"{digest}  {path}\n" for path, digest in hashes.items())


def read_record(path: str | Path) -> tuple[dict[str, str], dict[str, str]]:
    """(header, {path: SHA-256}) of a hash file."""
    info, hashes = {}, {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.startswith("#"):
            key, sep, value = line[1:].partition(":")
            if sep:
                info[key.strip()] = value.strip()
        elif line.strip():
            digest, sep, name = line.partition("  ")
            if not sep or len(digest) != 64:
                raise BfspoError(f"{path}:{n}: expected 'SHA256  PATH', got {line!r}")
            hashes[name] = digest
    if not hashes:
        raise BfspoError(f"{path}: no hashes")
    return info, hashes


def compare(record_path: str | Path, info: dict[str, str], hashes: dict[str, str]) -> tuple[bool, str]:
    """(whether the built files equal the recorded ones, a message saying so, with the CPU numerics
    of this build and, where the record's CPU vendor differs from this one's, whether the bytes
    matched across vendors; and, if they differ, why)."""
    from bfspo.toy.numerics import PINNED, describe

    rec_info, rec_hashes = read_record(record_path)
    paths = rec_hashes.keys() | hashes.keys()
    differ = sorted(p for p in paths if rec_hashes.get(p) != hashes.get(p))
    made = (f"recorded at commit {rec_info.get('commit', '?')} on {rec_info.get('date', '?')} "
            f"on {rec_info.get('cpu', '?')}")
    numerics = f"  CPU numerics of this build's SFT: {info.get('cpu_numerics')}"
    numerics += "." if info.get("cpu_numerics") == rec_info.get("cpu_numerics") else \
        f" (record: {rec_info.get('cpu_numerics', 'not recorded')})."
    vendor, rec_vendor = info.get("cpu_vendor"), rec_info.get("cpu_vendor")
    across = (f"  The record's CPU is a {rec_vendor} one ({rec_info.get('cpu')}), this build's a {vendor} one "
              f"({info.get('cpu')}): the bytes {{}} across CPU vendors." if rec_vendor and rec_vendor != vendor else "")
    start = ("  Start model: shipped: copied from its tracked folder, built by "
             f"`{info.get('command', '?')}` at commit {info.get('commit', '?')} on {info.get('cpu', '?')}; no SFT ran."
             if info.get("start") == "shipped" else "  Start model: rebuilt by this run's SFT (rule toy_model).")
    if not differ:
        lines = [f"toy check: MATCH: the toy data and model equal {record_path} bit for bit ({len(hashes)} files, {made}).",
                 start, numerics] + ([across.format("matched")] if across else [])
        return True, "\n".join(lines)
    lines = [f"toy check: MISMATCH: {len(differ)} of {len(paths)} files differ from {record_path} ({made}):"]
    lines += [f"  {p}" + ("" if p in hashes else " (not built)") + ("" if p in rec_hashes else " (not recorded)")
              for p in differ]
    lines += [start, numerics]
    if any(Path(p).suffix != ".jsonl" for p in differ):
        if across:
            lines.append(across.format("did not match"))
        kernels = [k for k in KERNEL_KEYS if rec_info.get(k) != info.get(k)]
        if kernels == ["cpu"] and info.get("cpu_numerics") == describe(PINNED):
            lines.append(f"  Only the CPU differs ({info.get('cpu')}; record: {rec_info.get('cpu')}), under the same "
                         "pinned numerics: they did not make these bytes CPU-independent. Report it, with both CPUs.")
        elif kernels:
            lines.append("  The model's bytes follow the CPU kernels, which differ here: "
                         + "; ".join(f"{k} {info.get(k)} (record: {rec_info.get(k, 'not recorded')})" for k in kernels)
                         + ".")
        else:
            lines.append("  CPU, numerics, torch and SFT threads are those of the record: the code, the data or the "
                         "installed packages differ (or the build is not deterministic: report it).")
        lines.append("  The tables will differ from results/recorded/ as well (docs/reproducibility.md).")
    else:
        lines.append("  Only data files differ: `bfspo toy data` or the toy config's data keys changed.")
    return False, "\n".join(lines)


def write_and_check(model_dir: str | Path, data_dir: str | Path, out: str | Path,
                    record: str | Path | None) -> str:
    """Write the hash file `out`; compare it with `record` if given. Returns the message to print;
    a mismatch is reported, not raised: another CPU type legitimately builds other bytes."""
    hashes = file_hashes(model_dir, data_dir)
    info = {"start": "shipped" if (Path(model_dir) / PROVENANCE).is_file() else "rebuilt"} | build_info(model_dir)
    atomic_write_text(out, format_record(info, hashes))
    if record is None:
        return f"toy check: wrote {out} ({len(hashes)} files); no record to compare with (toy.record unset)."
    if not Path(record).is_file():
        raise BfspoError(f"toy check: no record file {record}")
    return f"toy check: wrote {out}.\n" + compare(record, info, hashes)[1]
