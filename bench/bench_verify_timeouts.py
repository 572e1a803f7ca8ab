"""What pathological answers cost the verifier's ordinary answers, and what a repeat of them costs.

    python -m bench.bench_verify_timeouts seq   # one caller: 8 pathological answers, then 100 ordinary
    python -m bench.bench_verify_timeouts thr   # 16 threads: the same 108, interleaved

Pathological: `d^{d^{d^{d}}}` for d = 2..9 against the gold 7 (math-verify runs into its 5 s deadline
on most); ordinary: `\\frac{i}{2}` against i / 2, i = 1..100 (all correct). It prints one JSON line:
the first comparison's time (worker start-up), the whole pass, the mean and largest time of an
ordinary answer, how many ordinary answers were scored wrong, the timeouts counted, and the time of
the 8 pathological answers asked again. Only public behaviour is used, so the same script measures
an older checkout (PYTHONPATH=that checkout).
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from bfspo.tasks import verify

PATHOLOGICAL = [(f"\\boxed{{{d}^{{{d}^{{{d}^{{{d}}}}}}}}}", "7") for d in range(2, 10)]
ORDINARY = [(f"\\boxed{{\\frac{{{i}}}{{2}}}}", str(i / 2)) for i in range(1, 101)]


def timed(response: str, gold: str) -> tuple[bool, float]:
    start = time.perf_counter()
    ok = verify.is_correct("math500", response, gold)
    return ok, time.perf_counter() - start


def main(mode: str) -> dict:
    _, warm = timed("\\boxed{\\frac{1}{3}}", "0.5")
    if mode == "seq":
        items = PATHOLOGICAL + ORDINARY
        start = time.perf_counter()
        results = [timed(*item) for item in items]
    else:
        items = [x for pair in zip(PATHOLOGICAL + [None] * (len(ORDINARY) - len(PATHOLOGICAL)), ORDINARY)
                 for x in pair if x is not None]
        start = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda item: timed(*item), items))
    total = time.perf_counter() - start
    ordinary = [(ok, t) for item, (ok, t) in zip(items, results) if item in ORDINARY]
    again = time.perf_counter()
    for item in PATHOLOGICAL:
        timed(*item)
    return {"mode": mode, "warm_s": round(warm, 2), "total_s": round(total, 1),
            "ordinary_mean_s": round(sum(t for _, t in ordinary) / len(ordinary), 2),
            "ordinary_max_s": round(max(t for _, t in ordinary), 2),
            "ordinary_wrong": sum(not ok for ok, _ in ordinary), "timeouts": verify.timeouts(),
            "repeat_8_s": round(time.perf_counter() - again, 2)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else "seq")))
