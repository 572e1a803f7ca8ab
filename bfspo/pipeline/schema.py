"""A workflow config against its schema (workflow/schemas/config.schema.yaml), with errors a person
can act on: each violation in one line, its place in the config (`train.group_sise`), and for an
unknown key the closest known one ("did you mean 'seeds'?") and the known keys, as
`bfspo train --set` names them. jsonschema's own report (the whole schema and config, hundreds of
lines) follows only with BFSPO_VERBOSE=1 in the environment.

`validate_config` is what workflow/rules/common.smk and `load_config` (bfspo/pipeline/matrix.py) call:
Snakemake's `validate`, which also fills in the schema's defaults.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import yaml

from bfspo.errors import BfspoError

# The schema of a workflow config, in a source checkout (where the workflow is).
SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"
VERBOSE_ENV = "BFSPO_VERBOSE"
MAX_SHOWN = 3  # violations listed; the count of the others follows
_MAX_VALUE = 60  # characters of a value quoted in a message


class SchemaError(BfspoError):
    """A workflow config that its schema refuses."""


def validate_config(config: dict, schema: str | Path = SCHEMA) -> None:
    """Validate `config` in place (defaults filled in, as Snakemake's `validate`); a violation raises
    SchemaError with `schema_problems`' lines (and jsonschema's full report under BFSPO_VERBOSE=1)."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    try:
        validate(config, str(schema))
    except WorkflowError as e:
        lines = schema_problems(config, schema) or [str(e)]
        shown = lines[:MAX_SHOWN] + ([f"... and {len(lines) - MAX_SHOWN} more"] if len(lines) > MAX_SHOWN else [])
        if os.environ.get(VERBOSE_ENV, "") not in ("", "0"):
            shown.append(f"jsonschema's report:\n{e}")
        else:
            shown.append(f"({VERBOSE_ENV}=1 prints jsonschema's full report)")
        raise SchemaError("invalid config:\n  " + "\n  ".join(shown)) from None


def schema_problems(config: dict, schema: str | Path = SCHEMA) -> list[str]:
    """One line per violation of the schema, most relevant first (jsonschema's `best_match` order)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match, relevance

    validator = Draft202012Validator(yaml.safe_load(Path(schema).read_text(encoding="utf-8")))
    errors = sorted(validator.iter_errors(config), key=relevance)
    return [_describe(best_match([e])) for e in errors]


def _describe(error) -> str:
    """`where: what`, an unknown key with the close matches and the known keys."""
    where = _path(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = list(error.schema.get("properties", {}))
        unknown = [k for k in error.instance if k not in known]
        if known and unknown:
            return "; ".join(_unknown_key(where, k, known) for k in unknown)
    if error.validator == "enum":
        return f"{where}: {_short(error.instance)} is not one of {', '.join(map(str, error.validator_value))}"
    if error.validator == "required":
        return f"{where}: {error.message}"
    return f"{where}: {_short(error.instance)} is not valid here ({error.validator}: {_short(error.validator_value)})"


def _unknown_key(where: str, key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"{where}: unknown key '{key}'{hint} (known keys: {', '.join(known)})"


def _path(parts) -> str:
    """`train.group_size`, `tables.toy-ablation.columns[0]`; the top level is `config`."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "config"


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_VALUE else text[: _MAX_VALUE - 3] + "..."
