"""The verifier under many concurrent callers, and answer stripping on deeply nested wrappers.

    python -m bench.bench_verify --threads 8 24 --deadline 5 --nest 100000 200000

For each number of threads, that many threads call `is_correct("math500", "\\boxed{\\frac{i}{2}}",
str(i / 2))` at once (every answer correct) in a fresh process, and the table says how many were
scored False or raised, how many worker processes were alive at the end, and the wall time (worker
start-up included). Then `_strip_answer` on `$` * n + "42" + `$` * n, for each n. Only public
behaviour is used, so the same script measures an older checkout (PYTHONPATH=that checkout).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

CALLERS = r"""
import json, sys, threading, time
from pathlib import Path
from bfspo.tasks.verify import is_correct
n, deadline = int(sys.argv[1]), float(sys.argv[2])
results = {}
def call(i):
    try:
        results[i] = is_correct("math500", f"\\boxed{{\\frac{{{i}}}{{2}}}}", str(i / 2), timeout=deadline)
    except Exception as e:
        results[i] = repr(e)
start = time.perf_counter()
threads = [threading.Thread(target=call, args=(i,)) for i in range(1, n + 1)]
for t in threads:
    t.start()
for t in threads:
    t.join()
seconds = time.perf_counter() - start
workers = sum(b"serve_verifier" in Path(f"/proc/{pid}/cmdline").read_bytes()
              for children in Path("/proc/self/task").glob("*/children") for pid in children.read_text().split())
print(json.dumps({"wrong": sum(v is not True for v in results.values()), "workers": workers, "seconds": seconds}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[8, 24])
    parser.add_argument("--deadline", type=float, default=5.0)
    parser.add_argument("--nest", type=int, nargs="+", default=[100_000, 200_000])
    args = parser.parse_args()

    print("| threads | deadline s | correct answers scored False | workers alive | wall s |\n|---|---|---|---|---|")
    for n in args.threads:
        out = subprocess.run([sys.executable, "-c", CALLERS, str(n), str(args.deadline)], capture_output=True,
                             text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(f"| {n} | {args.deadline:g} | {r['wrong']} of {n} | {r['workers']} | {r['seconds']:.1f} |")

    from bfspo.tasks.verify import _strip_answer

    print("\n| nested $ pairs | characters | _strip_answer s |\n|---|---|---|")
    for n in args.nest:
        text = "$" * n + "42" + "$" * n
        start = time.perf_counter()
        assert _strip_answer(text) == "42"
        print(f"| {n} | {len(text)} | {time.perf_counter() - start:.4f} |")


if __name__ == "__main__":
    main()
