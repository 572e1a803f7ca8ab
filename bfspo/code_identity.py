"""The code a training run or an evaluation was made with, and the results made with other code.

Every run's done.json and every evaluation's summary.json record `code` (`identity`):

- `commit`: the git commit of the checkout that bfspo runs from, or "unknown" where there is none
  (an installed sdist or wheel, no git);
- `dirty`: whether the package bfspo/ differs from that commit (changed, staged or untracked
  files), or None without git;
- `source_sha256`: a fingerprint of the source that shapes the numbers (`source_fingerprint`),
  which needs no git: every .py file of the packages of `SCOPES`, by path and bytes;
- `scope`: which of `SCOPES` it covers.

The scopes: the code that shapes a trained adapter, "train" (bfspo/algorithm: loss, advantages,
search, rewards, packing, tree attention; bfspo/tasks: prompts, rows, the verifier; bfspo/rollout:
the engines; bfspo/training: the trainer, batching, accumulation, the config), and the code that
shapes an evaluation's numbers, "evaluate" (algorithm, tasks and rollout, and bfspo/evaluation).
Any byte of those files counts, a comment too: the fingerprint says that the code differs, not
whether the numbers would.

The code is not part of a run's identity: a finished run made with other code than the checkout's
is not trained again (hundreds of GPU-hours on a cluster), but named, by `snakemake -n` and by a note
under each table (`stale`); docs/workflow.md says how to rerun it.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from bfspo.errors import BfspoError
from bfspo.io import read_json

PACKAGE = Path(__file__).resolve().parent
SCOPES = {
    "train": ("algorithm", "tasks", "rollout", "training"),
    "evaluate": ("algorithm", "tasks", "rollout", "evaluation"),
}
UNKNOWN = "unknown"


def source_fingerprint(scope: str, package: Path = PACKAGE) -> str:
    """SHA-256 over the relative path and the SHA-256 of every .py file under the packages of
    `SCOPES[scope]` in `package` (the bfspo/ folder), in path order: the same bytes give the same
    fingerprint wherever the package is installed."""
    if scope not in SCOPES:
        raise BfspoError(f"code scope {scope!r}: one of {', '.join(SCOPES)}")
    h = hashlib.sha256()
    for sub in SCOPES[scope]:
        for path in sorted((package / sub).rglob("*.py")):
            h.update(f"{path.relative_to(package).as_posix()}\0{hashlib.sha256(path.read_bytes()).hexdigest()}\n"
                     .encode())
    return h.hexdigest()


def _git(package: Path, *args: str) -> str | None:
    """A git command's output in the checkout holding `package`, or None: no git, no checkout, or
    a checkout that does not hold this package (an installed copy inside some other repository)."""
    try:
        top = subprocess.run(["git", "-C", str(package), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=30)
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != package.parent.resolve():
            return None
        out = subprocess.run(["git", "-C", str(package.parent), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def identity(scope: str, package: Path = PACKAGE) -> dict:
    """{"commit", "dirty", "source_sha256", "scope"} of the code running now (module doc)."""
    commit = _git(package, "rev-parse", "HEAD")
    status = _git(package, "status", "--porcelain", "--", package.name) if commit else None
    return {"commit": commit.strip() if commit else UNKNOWN, "dirty": None if status is None else bool(status.strip()),
            "source_sha256": source_fingerprint(scope, package), "scope": scope}


def describe(code: dict) -> str:
    """A short name of a recorded `code`: "commit 1a2b3c4d (dirty)", "an unknown commit"."""
    commit = code.get("commit") or UNKNOWN
    name = "an unknown commit" if commit == UNKNOWN else f"commit {commit[:8]}"
    return name + (" (dirty)" if code.get("dirty") else "")


def stale(records: dict[str, str | Path], scope: str, package: Path = PACKAGE) -> dict[str, str]:
    """{name: the code it was made with} of the records (done.json or summary.json, by a name of the
    caller's) made with code of `scope` other than the checkout's. A record that is missing or
    unreadable is left to the checks that read it; one from a bfspo that did not record its code
    is not named (nothing says which code made it)."""
    current = source_fingerprint(scope, package)
    out = {}
    for name, path in records.items():
        try:
            code = read_json(path).get("code")
        except BfspoError:
            continue
        if isinstance(code, dict) and code.get("source_sha256") != current:
            out[name] = describe(code)
    return out


def stale_line(found: dict[str, str], what: str) -> str | None:
    """One line naming the `what`s (training run, evaluation) of `stale`'s answer, or None when there is none."""
    if not found:
        return None
    return (f"{len(found)} {what}{'' if len(found) == 1 else 's'} made with other code than this checkout's (bfspo/code_identity.py): "
            + "; ".join(f"{name} ({code})" for name, code in sorted(found.items())))
