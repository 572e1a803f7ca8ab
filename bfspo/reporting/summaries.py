"""What the tables and figures are built from: the table spec, our evaluation summaries and the
paper's numbers (`load_*`), and our cells scored from them (`score`: AES against our zero-shot run;
`aggregate`: mean, std and a 95% interval over seeds, and the runs behind each cell).

`bfspo tables` (tables.py), the figures (figures.py) and the paired layout (paired.py) all read
their inputs through this module.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from bfspo.errors import BfspoError
from bfspo.evaluation.metrics import aes, bootstrap_ci
from bfspo.io import read_json

ZERO_SHOT = "zero-shot"
METRICS = [("acc", "Acc.", 1), ("avg_len", "Avg. Len.", 0), ("aes", "AES", 2)]
REPORTED_COLUMNS = ["table", "model", "train_set", "benchmark", "domain", "method", "K", "ratio", "acc", "avg_len", "aes"]
# what an evaluation scored, by content (summary.json's settings.fingerprints): checked against its run
FINGERPRINTED = ("model", "tokenizer", "adapter")
# metric -> the summary.json key of its interval (AES has none)
SUMMARY_CI = {"acc": "accuracy_ci", "avg_len": "avg_length_ci"}


class Stat(NamedTuple):
    """One metric of one cell: mean and std over seeds, a 95% interval, the number of seeds (NaN: the paper's)."""

    mean: float
    std: float = math.nan
    n: float = math.nan
    ci_low: float = math.nan
    ci_high: float = math.nan


# ---- inputs ------------------------------------------------------------------------------------


def load_spec(text_or_path: str) -> dict:
    """A table spec given as JSON text or as the path of a JSON file."""
    if not text_or_path.lstrip().startswith("{"):
        return read_json(text_or_path)
    try:
        return json.loads(text_or_path)
    except json.JSONDecodeError as e:
        raise BfspoError(f"--spec: not valid JSON ({e.msg})") from None


def load_summaries(paths: list[str]) -> pd.DataFrame:
    """One row per summary.json: model, method, train_set, seed, benchmark, acc, avg_len."""
    rows = []
    for path in paths:
        s = read_json(path)
        meta = s.get("meta", {}) if isinstance(s, dict) else {}
        missing = [k for k in ("benchmark", "accuracy", "avg_length") if k not in s] + [
            f"meta.{k}" for k in ("model", "method") if k not in meta
        ]
        if missing:
            raise BfspoError(f"{path}: summary lacks {', '.join(missing)}")
        cis = {f"{m}_ci_{end}": float(s[key][i]) if s.get(key) else math.nan
               for m, key in SUMMARY_CI.items() for i, end in enumerate(("low", "high"))}
        settings = s.get("settings")
        prints = settings.get("fingerprints") if isinstance(settings, dict) else None
        prints = prints if isinstance(prints, dict) else {}
        rows.append(
            dict(
                model=meta["model"],
                method=meta["method"],
                train_set=meta.get("train_set", ""),
                seed=meta.get("seed", ""),
                benchmark=s["benchmark"],
                acc=float(s["accuracy"]),
                avg_len=float(s["avg_length"]),
                run=meta.get("run", ""),
                path=str(path),
                **cis,
                **{f"{part}_sha256": prints.get(part) for part in FINGERPRINTED},
            )
        )
    cis = [f"{m}_ci_{end}" for m in SUMMARY_CI for end in ("low", "high")]
    return pd.DataFrame(rows, columns=["model", "method", "train_set", "seed", "benchmark", "acc", "avg_len", "run",
                                       "path", *cis, *(f"{part}_sha256" for part in FINGERPRINTED)])


def check_trained_on(summaries: pd.DataFrame, runs_dir: str | Path) -> None:
    """BfspoError unless each evaluation of a trained run scored the adapter that run published, on the
    base model it was trained on: the fingerprints in its summary.json (`settings.fingerprints`,
    bfspo.evaluation.evaluate) against those the run recorded (inputs.json's model and tokenizer,
    done.json's adapter_sha256; bfspo/training/run_dir.py). A run that recorded none (made before
    fingerprints) is not checked; an evaluation that recorded none cannot match one that did."""
    from bfspo.fingerprint import RUN_INPUTS, digest

    def record(path: Path) -> dict:
        found = read_json(path) if path.is_file() else {}
        return found if isinstance(found, dict) else {}

    for r in summaries.itertuples():
        if r.method == ZERO_SHOT or not r.run:
            continue
        run_dir = Path(runs_dir) / r.run
        inputs, done = record(run_dir / RUN_INPUTS), record(run_dir / "done.json")
        recorded = {part: digest(inputs[part]) for part in ("model", "tokenizer") if isinstance(inputs.get(part), dict)}
        if isinstance(done.get("adapter_sha256"), str):
            recorded["adapter"] = done["adapter_sha256"]
        differ = [part for part in FINGERPRINTED if part in recorded and getattr(r, f"{part}_sha256") != recorded[part]]
        if differ:
            raise BfspoError(
                f"{r.path}: its {' and '.join(differ)} fingerprint(s) differ from those run {r.run} recorded "
                f"({run_dir}: {RUN_INPUTS}, done.json), so it did not score the adapter that run published on the "
                "base model it was trained on (a rebuilt model, or a run retrained after this evaluation). "
                "Evaluate the run again: delete that summary.json and rerun")


def load_reported(path: str | None) -> pd.DataFrame:
    """The paper's numbers (data/reported_results.csv); empty when no file is given."""
    if path is None:
        return pd.DataFrame(columns=REPORTED_COLUMNS)
    if not Path(path).is_file():
        raise BfspoError(f"{path}: no such file")
    df = pd.read_csv(path)
    missing = [c for c in REPORTED_COLUMNS if c not in df.columns]
    if missing:
        raise BfspoError(f"{path}: missing columns {', '.join(missing)}")
    return df


# ---- our numbers -------------------------------------------------------------------------------


def score(summaries: pd.DataFrame) -> pd.DataFrame:
    """Add each summary's AES against the zero-shot summary of the same model and benchmark
    (NaN where there is none, or where the zero-shot accuracy is 0 and AES is undefined)."""
    base = summaries[summaries.method == ZERO_SHOT]
    dup = base[base.duplicated(["model", "benchmark"], keep=False)]
    if len(dup):
        raise BfspoError(f"two zero-shot summaries for the same model and benchmark: {', '.join(dup.path)}")
    base = base.set_index(["model", "benchmark"])

    def row_aes(r):
        if (r.model, r.benchmark) not in base.index:
            return math.nan
        b = base.loc[(r.model, r.benchmark)]
        try:
            return aes(r.acc, r.avg_len, b.acc, b.avg_len)
        except BfspoError as e:
            print(f"warning: no AES for {r.path}: {e}", file=sys.stderr)
            return math.nan

    out = summaries.copy()
    out["aes"] = [row_aes(r) for r in summaries.itertuples()] if len(summaries) else []
    return out


def _stat(values: pd.Series, ci_low: float, ci_high: float) -> Stat:
    """Mean and std over seeds with the seed mean's bootstrapped 95% interval; one seed keeps its
    summary.json interval (ci_low, ci_high; NaN when it has none)."""
    x = values.dropna()
    if len(x) > 1:
        return Stat(float(x.mean()), float(x.std(ddof=1)), len(x), *bootstrap_ci(x.to_numpy()))
    return Stat(float(x.mean()) if len(x) else math.nan, math.nan, len(x), ci_low, ci_high)


def aggregate(scored: pd.DataFrame) -> dict[tuple, dict]:
    """(model, method, train_set, benchmark) -> {metric: Stat} over seeds, and under "runs" the
    names of the runs behind the cell (the training runs; for zero-shot, the base model's)."""
    cells = {}
    for key, g in scored.groupby(["model", "method", "train_set", "benchmark"], sort=False):
        first = g.iloc[0]
        cells[key] = {m: _stat(g[m], first.get(f"{m}_ci_low", math.nan), first.get(f"{m}_ci_high", math.nan))
                      for m, _, _ in METRICS}
        cells[key]["runs"] = sorted({r for r in g.run if r})
    return cells
