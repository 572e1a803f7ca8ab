"""The prepared question rows that training and evaluation read, under one rule.

A row is a JSON object with `id`, `question` and `answer`. The answer and the question are text or a
number, the id text or an integer; each is kept as text (`answer: 2.5` is the gold answer "2.5", as
a TRL or verl data set would give it), so ids 1 and "1" are the same id, and a duplicate. A row
larger than the model could hold is refused on its size in bytes, before any tokenising: a
tokeniser given one giant line takes gigabytes of memory first.
"""

from __future__ import annotations

import math
import os

from bfspo.errors import BfspoError
from bfspo.io import read_jsonl

# Bytes of question text that one token covers at most, generously: BPE tokens of natural text and
# mathematics are a few bytes; a run of spaces or repeated punctuation rarely passes 16.
BYTES_PER_TOKEN = 32

# field -> the JSON types it may have (a bool is refused although Python counts it an int)
FIELD_TYPES = {"id": (str, int), "question": (str, int, float), "answer": (str, int, float)}


def _text(value, key: str) -> str:
    """The field's value as text; BfspoError text for a missing, empty or mistyped one."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"missing or empty field {key!r}")
    if not isinstance(value, FIELD_TYPES[key]) or isinstance(value, bool):
        kinds = "text or an integer" if float not in FIELD_TYPES[key] else "text or a number"
        raise ValueError(f"field {key!r} must be {kinds}, got {_json_type(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"field {key!r} must be a finite number, got {value}")
    return value if isinstance(value, str) else str(value)


def _json_type(value) -> str:
    return {bool: "true/false", list: "a list", dict: "an object", float: "a number", int: "a number"}.get(
        type(value), type(value).__name__)


def read_rows(path: str | os.PathLike, limit: int | None = None, max_positions: int | None = None,
              benchmark: str | None = None, data: bytes | None = None) -> list[dict]:
    """The rows of `path` (its first `limit`), each with `id`, `question` and `answer` as text and any
    other fields as they are; parsed from `data`, the file's bytes already read and fingerprinted
    (bfspo.fingerprint.read_data), if given. A row that is not a JSON object (or nests too deeply:
    bfspo.io), a missing, empty or mistyped field, a duplicate id, a question of more than
    `max_positions` x BYTES_PER_TOKEN bytes, or (given `benchmark`) a row that names another
    benchmark is an error naming the file and line."""
    rows, seen = [], {}
    for lineno, row in read_jsonl(path, data=data):
        if limit is not None and len(rows) == limit:
            break
        try:
            fields = {key: _text(row.get(key), key) for key in FIELD_TYPES}
        except ValueError as e:
            raise BfspoError(f"{path}:{lineno}: {e}") from None
        if fields["id"] in seen:
            raise BfspoError(f"{path}:{lineno}: duplicate id {fields['id']!r} (first on line {seen[fields['id']]}; "
                             "ids are compared as text, so 1 and \"1\" are the same)")
        seen[fields["id"]] = lineno
        size = len(fields["question"].encode("utf-8"))
        if max_positions is not None and size > max_positions * BYTES_PER_TOKEN:
            raise BfspoError(f"{path}:{lineno}: question {fields['id']!r} is {size} bytes, more than the model's "
                             f"{max_positions} positions can hold at {BYTES_PER_TOKEN} bytes a token; refused before "
                             "tokenising it")
        if benchmark is not None and row.get("benchmark", benchmark) != benchmark:
            raise BfspoError(f"{path}:{lineno}: row of benchmark {row['benchmark']!r}, but evaluating {benchmark!r}")
        rows.append(row | fields)
    return rows
