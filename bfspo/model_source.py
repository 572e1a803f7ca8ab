"""Where a model comes from, a local folder or a hub id, checked before anything loads it.

`local_problem` is what the workflow checks when it plans (bfspo/pipeline/preflight.py), for every size
class: a path that names no folder, or a folder that holds no model. `check_model_source`, which
every loader calls (bfspo/model_io.py), also asks the hub about a hub id that is not in the local
cache, once and without retries, so a typo on a machine without a hub is named at once (rather than
after a minute of retries ending in "check your internet connection").

Light: no torch, and huggingface_hub only for a hub id.
"""

from __future__ import annotations

import os
from pathlib import Path

from bfspo.errors import BfspoError

HUB_TIMEOUT_S = 10  # one question to the hub, no retries


def offline() -> bool:
    """Whether Hugging Face downloads are switched off (HF_HUB_OFFLINE)."""
    from huggingface_hub import is_offline_mode

    return is_offline_mode() or os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def looks_like_path(name: str) -> bool:
    """Hub ids are `name` or `owner/name`; anything else (absolute, ./, ~, deeper) is a local path."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name


def local_problem(name: str) -> str | None:
    """What is wrong with `name` as a local model: a path to no folder, or a folder (or file) without
    a config.json. None for a model folder, and for a hub id (which `check_model_source` asks about)."""
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir() or not (path / "config.json").is_file():
            return f"{name}: not a model directory (no config.json)"
        return None
    if looks_like_path(name):
        return f"{name}: no such model directory"
    return None


def check_model_source(name: str) -> None:
    """BfspoError unless `name` is a model folder, or a hub id that is cached or that the hub answers for."""
    problem = local_problem(name)
    if problem:
        raise BfspoError(problem)
    if not Path(name).expanduser().exists():
        check_hub_id(name)


def check_hub_id(name: str) -> None:
    """BfspoError unless hub id `name` has a config.json in the local cache or on the hub (asked once)."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
    )

    neither = f"{name}: neither a local folder nor"
    try:
        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return
    except HFValidationError:
        raise BfspoError(f"{neither} a valid hub id (owner/name)") from None
    if offline():
        raise BfspoError(f"{neither} reachable: not in the Hugging Face cache, and HF_HUB_OFFLINE=1 forbids "
                         "downloading it") from None
    try:
        get_hf_file_metadata(hf_hub_url(name, "config.json"), timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return  # a gated model: loading it says whether the user's token may
    except RepositoryNotFoundError:
        raise BfspoError(f"{neither} a model on the Hugging Face hub (no such repository, or a private one and no "
                         "token)") from None
    except RemoteEntryNotFoundError:
        raise BfspoError(f"{name}: a hub repository without config.json, not a model") from None
    except HfHubHTTPError as e:
        raise BfspoError(f"{neither} reachable: the hub at {constants.ENDPOINT} answered "
                         f"{str(e).splitlines()[0]}") from None
    except Exception as e:  # httpx's connection refused, name resolution or timeout
        raise BfspoError(f"{neither} reachable: the hub at {constants.ENDPOINT} did not answer "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no detail'}); check the id, or "
                         "download the model where there is a network and pass its folder") from None
