"""`bfspo toy forms EVAL_DIR ...`: how verbose a toy model's answers are, from an evaluation's
samples.jsonl. Each line of an answer is classified by `bfspo.toy.task.line_forms`; the report gives
the share of each form, and accuracy and length by the share of verbose lines in an answer."""

from __future__ import annotations

from collections.abc import Iterable
from statistics import mean

from bfspo.toy.task import FORMS, line_forms

# Answers are grouped by their share of verbose lines: [0, 1/3), [1/3, 2/3], (2/3, 1].
BINS = ("< 1/3", "1/3-2/3", "> 2/3")


def _bin(share: float) -> str:
    return BINS[0] if share < 1 / 3 else BINS[2] if share > 2 / 3 else BINS[1]


def verbosity_report(samples: Iterable[dict]) -> dict:
    """{answers, accuracy, avg_length, line_share: {form: share of all lines},
    by_verbose_share: {bin: {answers, accuracy, avg_length}}} over evaluation sample rows
    (`response`, `correct`, `num_tokens`); accuracies in percent."""
    rows = list(samples)
    if not rows:
        raise ValueError("no samples")
    forms = [line_forms(r["response"]) for r in rows]
    lines = [f for fs in forms for f in fs]
    groups = {b: [] for b in BINS}
    for r, fs in zip(rows, forms):
        groups[_bin(fs.count("verbose") / len(fs) if fs else 0.0)].append(r)

    def summary(rs):
        return {"answers": len(rs), "accuracy": 100 * mean(r["correct"] for r in rs) if rs else None,
                "avg_length": mean(r["num_tokens"] for r in rs) if rs else None}

    return {**summary(rows), "line_share": {f: lines.count(f) / max(len(lines), 1) for f in FORMS},
            "by_verbose_share": {b: summary(rs) for b, rs in groups.items()}}


def format_report(name: str, report: dict) -> str:
    """The report as text: one summary line, then one line per bin of verbose-line share."""

    def num(x, fmt, unit=""):
        return "-" if x is None else format(x, fmt) + unit

    out = [f"{name}: {report['answers']} answers, accuracy {num(report['accuracy'], '.1f', '%')}, "
           f"{num(report['avg_length'], '.1f')} tokens; lines: "
           + ", ".join(f"{f} {s:.0%}" for f, s in report["line_share"].items()),
           "  verbose lines   answers  accuracy  avg length"]
    for b, s in report["by_verbose_share"].items():
        out.append(f"  {b:15s} {s['answers']:7d}  {num(s['accuracy'], '.1f', '%'):>8s}  {num(s['avg_length'], '.1f'):>10s}")
    return "\n".join(out)
