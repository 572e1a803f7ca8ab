"""`bfspo prepare`: normalise the raw benchmark files into one JSONL per split.

Each output row is {id, question, answer, benchmark, ...source fields}, where `answer` is the
final gold answer string that `bfspo.tasks.verify.is_correct` compares against:
  GSM8K          the number after `####`, commas removed;
  MATH, MATH-500 the `answer` field, or the last \\boxed{} of the solution where there is none;
  Minerva-Math   the last \\boxed{} of the solution;
  AIME'25        the integer answer ("70", from a raw 70.0);
  MMLU-STEM      the letter A-D; the question carries its choices as `A. ...` lines.

A malformed row (bad JSON, a missing field, an answer that cannot be extracted) is an error that
names the file and line, and no output is written. With --skip-malformed such rows are skipped,
counted, printed and recorded in `<split>.report.json`. Row counts are checked against the
published split sizes; a mismatch is an error unless skipping was requested.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bfspo.errors import BfspoError
from bfspo.io import read_jsonl, write_json, write_jsonl
from bfspo.tasks.prompts import CHOICE_LETTERS, format_choices
from bfspo.tasks.verify import last_boxed


class Malformed(Exception):
    """A raw row that cannot be normalised; the message says why."""


def _field(obj: dict, key: str, types: type | tuple[type, ...] = str):
    if key not in obj:
        raise Malformed(f"missing field {key!r}")
    value = obj[key]
    if not isinstance(value, types) or isinstance(value, bool) or (isinstance(value, str) and not value.strip()):
        raise Malformed(f"field {key!r} is empty or not of the expected type ({value!r:.60})")
    return value


def _source_fields(obj: dict, keys: tuple[str, ...]) -> dict:
    return {k: obj[k] for k in keys if k in obj}


def gsm8k_row(obj: dict) -> dict:
    """GSM8K: the gold answer is the number after `####`, with thousands commas removed."""
    solution = _field(obj, "answer")
    if "####" not in solution:
        raise Malformed("no '####' final answer in field 'answer'")
    answer = solution.rsplit("####", 1)[1].strip().replace(",", "")
    if not re.fullmatch(r"-?\d+(?:\.\d+)?", answer):
        raise Malformed(f"the answer after '####' is not a number: {answer!r:.60}")
    return {"question": _field(obj, "question"), "answer": answer, "solution": solution}


def _boxed_answer(solution: str) -> str:
    boxed = last_boxed(solution)
    if boxed is None or not boxed.strip():
        raise Malformed("no \\boxed{} answer in field 'solution'")
    return boxed.strip()


def math_row(obj: dict) -> dict:
    """MATH and MATH-500: the `answer` field, else the last \\boxed{} of the solution."""
    solution = _field(obj, "solution")
    answer = _field(obj, "answer").strip() if "answer" in obj else _boxed_answer(solution)
    return {"question": _field(obj, "problem"), "answer": answer, "solution": solution,
            **_source_fields(obj, ("level", "type", "unique_id", "idx"))}


def minerva_row(obj: dict) -> dict:
    """Minerva-Math: the last \\boxed{} of the solution."""
    solution = _field(obj, "solution")
    return {"question": _field(obj, "problem"), "answer": _boxed_answer(solution), "solution": solution,
            **_source_fields(obj, ("type", "idx"))}


def aime_row(obj: dict) -> dict:
    """AIME'25: the integer answer (the raw file stores floats such as 70.0)."""
    raw = _field(obj, "answer", (int, float, str))
    try:
        value = float(raw)
    except ValueError:
        raise Malformed(f"answer is not a number: {raw!r:.60}") from None
    if not value.is_integer():
        raise Malformed(f"answer is not an integer: {raw!r}")
    return {"question": _field(obj, "question"), "answer": str(int(value)),
            **({"source_id": obj["id"]} if "id" in obj else {})}


def mmlu_row(obj: dict) -> dict:
    """MMLU-STEM: the question with `A. ...` choice lines; the gold answer is the letter."""
    choices = _field(obj, "choices", list)
    index = _field(obj, "answer", int)
    if len(choices) != len(CHOICE_LETTERS) or not all(isinstance(c, str) for c in choices):
        raise Malformed(f"expected {len(CHOICE_LETTERS)} string choices, got {choices!r:.80}")
    if not 0 <= index < len(CHOICE_LETTERS):
        raise Malformed(f"answer index {index} is not in 0..{len(CHOICE_LETTERS) - 1}")
    return {"question": format_choices(_field(obj, "question"), choices), "answer": CHOICE_LETTERS[index],
            **({"subject": obj["type"]} if "type" in obj else {}), "choices": choices, "answer_index": index}


@dataclass(frozen=True)
class Split:
    """One output split: where its raw file lies under --raw-dir, its size, and its row parser."""

    name: str
    raw: str
    count: int
    parse: Callable[[dict], dict]


SPLITS: dict[str, Split] = {
    s.name: s
    for s in (
        Split("gsm8k_train", "gsm8k/train.jsonl", 7473, gsm8k_row),
        Split("math_train", "math/train.jsonl", 4500, math_row),
        Split("gsm8k", "gsm8k/test.jsonl", 1319, gsm8k_row),
        Split("math500", "math500/test.jsonl", 500, math_row),
        Split("mmlu_stem", "mmlu_stem/test.jsonl", 3018, mmlu_row),
        Split("aime25", "aime25/test.jsonl", 30, aime_row),
        Split("minerva_math", "minerva_math/test.jsonl", 272, minerva_row),
    )
}


def prepare_split(split: Split, raw_dir: Path, skip_malformed: bool = False) -> tuple[list[dict], dict]:
    """Normalise one split: (rows, report). Raises BfspoError naming file:line for a malformed row
    unless `skip_malformed`, and for a count mismatch unless `skip_malformed`."""
    path = raw_dir / split.raw
    if not path.is_file():
        raise BfspoError(f"{path}: raw file for split {split.name!r} not found")
    rows, malformed = [], []
    for lineno, obj in read_jsonl(path, skipped=malformed if skip_malformed else None):
        try:
            row = split.parse(obj)
        except Malformed as e:
            if not skip_malformed:
                raise BfspoError(f"{path}:{lineno}: {e}") from None
            malformed.append({"line": lineno, "problem": str(e)})
            continue
        rows.append({"id": f"{split.name}-{lineno - 1}", "question": row.pop("question"),
                     "answer": row.pop("answer"), "benchmark": split.name, **row})
    malformed.sort(key=lambda m: m["line"])
    count_ok = len(rows) == split.count
    if not count_ok and not skip_malformed:
        raise BfspoError(f"{path}: {len(rows)} rows, but split {split.name!r} has {split.count}")
    report = {"split": split.name, "raw": str(path), "rows": len(rows), "expected": split.count,
              "count_ok": count_ok, "skipped": len(malformed), "malformed": malformed}
    return rows, report


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--raw-dir", type=Path, default=Path("data/raw"), help="folder of the raw <bench>/*.jsonl files")
    parser.add_argument("--out-dir", type=Path, default=Path("results/data"), help="where <split>.jsonl files go")
    parser.add_argument("--splits", nargs="+", choices=list(SPLITS), default=list(SPLITS), metavar="SPLIT",
                        help=f"splits to write (default: all of {', '.join(SPLITS)})")
    parser.add_argument("--skip-malformed", action="store_true",
                        help="skip malformed rows (counted, printed and reported) instead of failing")


def run(args: argparse.Namespace) -> int:
    # Every split is read and checked before any file is written, so an error leaves no output.
    prepared = [prepare_split(SPLITS[name], args.raw_dir, args.skip_malformed) for name in args.splits]
    for rows, report in prepared:
        name = report["split"]
        write_jsonl(args.out_dir / f"{name}.jsonl", rows)
        write_json(args.out_dir / f"{name}.report.json", report)
        note = "" if report["count_ok"] else f" (expected {report['expected']})"
        print(f"{name}: {len(rows)} rows{note} -> {args.out_dir / f'{name}.jsonl'}")
        if report["skipped"]:
            lines = ", ".join(str(m["line"]) for m in report["malformed"][:10])
            print(f"{name}: skipped {report['skipped']} malformed rows of {report['raw']} (lines {lines}"
                  f"{', ...' if report['skipped'] > 10 else ''}); see {args.out_dir / f'{name}.report.json'}")
    return 0
