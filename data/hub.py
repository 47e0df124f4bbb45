"""A model named by the user (a directory or a Hugging Face hub id) that is not there, as one eyas error.

with model_errors(name, key):   transformers' and huggingface_hub's failures to find `name` become an
    ...                         InputError / RunError naming `key` and the fix
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path

from eyas.infra.errors import InputError, RunError, causes

HUB_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")  # name or org/name


@contextmanager
def model_errors(name: str, key: str = "target.model", file: str | None = None):
    """transformers' and huggingface_hub's failures to find model `name` (or its one `file`, a GGUF) -> an
    eyas error that names `key` and what to do: a missing directory, hub repo or file, or a hub that cannot
    be reached."""

    given, fetch = (f"{name}/{file}", f"{name} {file}") if file else (name, name)

    local = Path(name).expanduser()
    if not local.exists() and (not HUB_REPO_ID.match(name) or name.startswith((".", "/", "~"))):
        raise InputError(
            f"{key}={name}: no such directory, and not a Hugging Face hub id (ORG/NAME); "
            f"set {key} to a model directory holding config.json, or to a hub id"
        )
    try:
        yield
    except (OSError, ValueError) as e:
        from huggingface_hub.errors import (
            GatedRepoError,
            LocalEntryNotFoundError,
            RemoteEntryNotFoundError,
            RepositoryNotFoundError,
        )

        chain = list(causes(e))
        if local.is_dir():
            if (local / "config.json").is_file():
                # the model is there; what failed is for its own message (trust_remote_code, placement…)
                raise
            raise InputError(
                f"{key}={name}: the directory has no config.json; set {key} to the folder that "
                "holds the model's config.json and weights"
            ) from e
        if any(isinstance(c, (RepositoryNotFoundError, GatedRepoError)) for c in chain):
            raise InputError(
                f"{key}={name}: no such model on the Hugging Face hub, or it is gated or private and "
                "this token cannot read it; check the id, or `hf auth login` with a token that has "
                "access"
            ) from e
        if file and any(type(c) is RemoteEntryNotFoundError for c in chain):
            raise InputError(f"{key}={given}: the hub repo {name} has no file {file}; check its name") from e
        if any(isinstance(c, LocalEntryNotFoundError) for c in chain):
            from huggingface_hub import constants

            why = (
                "HF_HUB_OFFLINE is set"
                if constants.HF_HUB_OFFLINE
                else f"{constants.ENDPOINT} cannot be reached"
            )
            raise RunError(
                f"{key}={given}: not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {why}; "
                f"download it where there is network (`hf download {fetch}`) into that cache, or set "
                f"{key} to a local model directory"
            ) from e
        raise
