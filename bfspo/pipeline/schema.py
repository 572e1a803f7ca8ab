"""A workflow config against its schema (workflow/schemas/config.schema.yaml), with errors a person
can act on: each violation in one line, its place in the config (`train.group_sise`), and for an
unknown key the closest known one ("did you mean 'seeds'?") and the known keys, as
`bfspo train --set` names them. jsonschema's own report (the whole schema and config, hundreds of
lines) follows only with BFSPO_VERBOSE=1 in the environment. `located` puts the config file's name
before each line (`config/paper.yaml: slurm.qos: ...`), as the workflow and `bfspo plan` print them.

`validate_config` is what workflow/rules/common.smk and `load_config` (bfspo/pipeline/matrix.py) call:
Snakemake's `validate`, which also fills in the schema's defaults.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from bfspo.errors import BfspoError
from bfspo.io import read_yaml

# The schema of a workflow config, in a source checkout (where the workflow is).
SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"
VERBOSE_ENV = "BFSPO_VERBOSE"
MAX_SHOWN = 3  # violations listed; the count of the others follows
_MAX_VALUE = 60  # characters of a value quoted in a message


class ConfigProblems(BfspoError):
    """A workflow config refused: one line per problem, each placed in the config (`train.lr: ...`),
    and a footer; `located(source)` puts the config file's name before each line."""

    def __init__(self, problems: list[str], footer: str | None = None):
        self.problems, self.footer = list(problems), footer
        super().__init__(self.located(None))

    def located(self, source: str | None) -> str:
        lines = [f"{source}: {p}" if source else p for p in self.problems] + ([self.footer] if self.footer else [])
        return "invalid config:\n  " + "\n  ".join(lines)


class SchemaError(ConfigProblems):
    """A workflow config that its schema refuses."""


def verbose() -> bool:
    """BFSPO_VERBOSE=1 in the environment: the full reports (jsonschema's, Snakemake's own location)."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def located(error: BfspoError, source: str) -> str:
    """An error refusing a config, with the config file's name (`source`) before each of its lines."""
    return error.located(source) if isinstance(error, ConfigProblems) else f"{source}: {error}"


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
        footer = f"jsonschema's report:\n{e}" if verbose() else f"({VERBOSE_ENV}=1 prints jsonschema's full report)"
        raise SchemaError(shown, footer) from None


def schema_problems(config: dict, schema: str | Path = SCHEMA) -> list[str]:
    """One line per violation of the schema, most relevant first (jsonschema's `best_match` order),
    each after its key path (`slurm.qos: ...`; nothing before a problem of the top level)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match, relevance

    validator = Draft202012Validator(read_yaml(schema))
    errors = sorted(validator.iter_errors(config), key=relevance)
    return [_describe(best_match([e])) for e in errors]


def _describe(error) -> str:
    """`where: what`, an unknown key with the close matches and the known keys."""
    where = _path(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = list(error.schema.get("properties", {}))
        unknown = [k for k in error.instance if k not in known]
        if known and unknown:
            return "; ".join(_at(where, _unknown_key(k, known)) for k in unknown)
    if error.validator == "enum":
        return _at(where, f"{_short(error.instance)} is not one of {', '.join(map(str, error.validator_value))}")
    if error.validator == "required":
        return _at(where, error.message)
    return _at(where, f"{_short(error.instance)} is not valid here ({error.validator}: {_short(error.validator_value)})")


def _at(where: str, what: str) -> str:
    return f"{where}: {what}" if where else what


def _unknown_key(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"unknown key '{key}'{hint} (known keys: {', '.join(known)})"


def _path(parts) -> str:
    """`train.group_size`, `tables.toy-ablation.columns[0]`; "" at the top level."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_VALUE else text[: _MAX_VALUE - 3] + "..."
