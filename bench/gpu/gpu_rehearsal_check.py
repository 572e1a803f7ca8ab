"""What the CPU rehearsal of the GPU check checks (`make gpu-session-rehearsal`, issue 38): what a CPU
can check of a GPU run, not its timings (shared cores; the `tiny` preset lifts the limits).

- OUT is what the device returns whole: at most 8 files, none deeper than OUT/a/b/file, each a plain
  file whose name is letters, digits, `.`, `_` and `-` (`out_problems`): here the four of
  bench.gpu.gpu_check.OUT_FILES.
- Every part ran and measured: its status "ok" and at least one measurement in results.json.
- A part writes what it measures before its end: `kill_after_first` runs one part alone, kills its
  process group (as its limit would) as soon as its first measurement is in results.json, and
  returns the part's record, which must hold that measurement.

    python -m bench.gpu.gpu_rehearsal_check OUT     # after bench/gpu/gpu_session.sh OUT --preset tiny
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.gpu.gpu_check import OUT_FILES, PARTS, load

MAX_FILES = 8  # what the device returns from OUT
MAX_DEPTH = 3  # OUT/a/b/file
PLAIN = re.compile(r"[A-Za-z0-9._-]+")


def out_problems(out: Path) -> list[str]:
    """Why the device would not return OUT whole (none: it would)."""
    problems = []
    entries = sorted(out.rglob("*"))
    files = [p for p in entries if not p.is_dir() or p.is_symlink()]
    if len(files) > MAX_FILES:
        problems.append(f"{len(files)} files, more than {MAX_FILES}: {[str(p.relative_to(out)) for p in files]}")
    for p in entries:
        rel = p.relative_to(out)
        if p.is_symlink() or not (p.is_file() or p.is_dir()):
            problems.append(f"{rel}: not a plain file")
        if not all(PLAIN.fullmatch(part) for part in rel.parts):
            problems.append(f"{rel}: a name other than letters, digits, '.', '_' and '-'")
        if p.is_file() and len(rel.parts) > MAX_DEPTH:
            problems.append(f"{rel}: deeper than OUT/a/b/file")
    return problems


def part_problems(out: Path) -> list[str]:
    """Parts that did not run to the end or measured nothing; summary.md without a part's section."""
    results, summary = load(out), (out / "summary.md").read_text()
    problems = []
    for part in PARTS:
        record = results["parts"].get(part, {})
        if record.get("status") != "ok" or not record.get("measurements"):
            problems.append(f"{part}: {record.get('status', 'absent')}, {len(record.get('measurements', []))} "
                            "measurements")
        if f"\n## {part}\n" not in summary:
            problems.append(f"{part}: no section in summary.md")
    missing = [name for name in OUT_FILES if not (out / name).is_file()]
    return problems + ([f"missing: {missing}"] if missing else [])


def kill_after_first(out: Path, part: str, preset: str = "tiny", timeout_s: float = 900) -> tuple[dict, int]:
    """Run `part` alone into `out` and kill its process group as soon as its first measurement is in
    results.json: (the part's record, the check's exit status)."""
    check = subprocess.Popen([sys.executable, "-m", "bench.gpu.gpu_check", "--out", str(out), "--preset", preset,
                              "--parts", part])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and check.poll() is None:
            record = load(out)["parts"].get(part, {}) if (out / "results.json").exists() else {}
            if record.get("measurements") and "pid" in record:
                os.killpg(record["pid"], signal.SIGKILL)
                break
            time.sleep(0.2)
        rc = check.wait(timeout=60)
    finally:
        if check.poll() is None:
            check.kill()
    return load(out)["parts"][part], rc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="the rehearsal's OUT (bench/gpu/gpu_session.sh OUT --preset tiny)")
    p.add_argument("--kill-part", default="update", choices=PARTS, help="the part killed after its first measurement")
    args = p.parse_args()
    problems = out_problems(args.out) + part_problems(args.out)
    killed_out = args.out.with_name(args.out.name + "-killed")
    record, rc = kill_after_first(killed_out, args.kill_part)
    first = (record.get("measurements") or [None])[0]
    if rc != 1 or not record.get("status", "").startswith("killed by signal") or first is None:
        problems.append(f"{args.kill_part} killed after its first measurement: exit {rc}, status "
                        f"{record.get('status')!r}, measurements {record.get('measurements')}")
    problems += [f"{killed_out.name}: {x}" for x in out_problems(killed_out)]
    for problem in problems:
        print(f"gpu-session-rehearsal: {problem}", file=sys.stderr)
    if not problems:
        print(f"OUT: {len(list(args.out.iterdir()))} plain files; every part ran and measured; {args.kill_part}, "
              f"killed after its first measurement, left it in results.json ({first.get('stage', first)})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
