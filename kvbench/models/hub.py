"""A model's ``config.json`` by Hugging Face Hub id (``meta-llama/Llama-3.1-8B-Instruct``), through huggingface_hub.

Only ``config.json`` is fetched: no weights, no tokenizer, no remote code. With ``HF_HUB_OFFLINE=1`` the local
cache alone is read; without it the Hub is asked and, when it cannot be reached, the cached copy is used. When
neither gives the file, one line says which and what to do. The environment is read at each call (not when
huggingface_hub was imported), so a process that changes ``HF_HUB_OFFLINE``, ``HF_HUB_CACHE`` or ``HF_ENDPOINT``
is obeyed.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kvbench.errors import KvbenchError

# owner/name as the Hub spells repositories: letters, digits, '-', '_', '.'; neither part starts with '.' or '-'
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9_][\w.-]{0,95}", re.ASCII)  # the Hub's ids are ASCII
_TRUE = {"1", "on", "yes", "true"}


def looks_like_hub_id(spec: str) -> bool:
    """``owner/name`` and nothing that reads as a local path (``./x``, ``/x``, ``~``, ``a/b/c``, ``*.gguf``)."""
    if not _HUB_ID.fullmatch(spec) or ".." in spec:
        return False
    return not spec.lower().endswith((".gguf", ".json"))


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def cache_dir() -> Path:
    """The Hub cache huggingface_hub uses: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def hub_config_path(repo_id: str, revision: str | None = None) -> Path:
    """The local path of ``repo_id``'s ``config.json``: from the cache, downloaded into it when online.

    Online, one request asks the Hub for the file (no retries: an unreachable Hub falls back to the cache at
    once rather than after huggingface_hub's back-off); huggingface_hub's own log lines are held back, so a
    failure is the one line of the error.
    """
    try:
        from huggingface_hub import errors as hub_errors
        from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url, try_to_load_from_cache
    except ImportError:  # pragma: no cover - a dependency of transformers, so normally present
        raise KvbenchError(
            f"{repo_id} looks like a Hugging Face model id, but huggingface_hub is not installed: "
            "pip install huggingface_hub, or pass a local checkpoint directory"
        ) from None
    cache = cache_dir()
    where = f"the local Hugging Face cache ({cache})"
    endpoint = os.environ.get("HF_ENDPOINT") or None

    def cached() -> Path | None:
        found = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache, revision=revision)
        return Path(found) if isinstance(found, str) else None

    with _quiet_hub():
        if offline():
            path = cached()
            if path is None:
                raise KvbenchError(
                    f"{repo_id}: config.json is not in {where}, and HF_HUB_OFFLINE=1 forbids asking "
                    "the Hub: unset HF_HUB_OFFLINE once, or pass a local checkpoint directory"
                )
            return path
        try:
            get_hf_file_metadata(hf_hub_url(repo_id, "config.json", revision=revision, endpoint=endpoint))
            return Path(hf_hub_download(repo_id, "config.json", revision=revision, cache_dir=cache, endpoint=endpoint))
        except hub_errors.GatedRepoError:
            raise KvbenchError(
                f"{repo_id} is a gated model and {where} has no copy of its config.json: accept its "
                "license on huggingface.co, then log in (hf auth login, or set HF_TOKEN)"
            ) from None
        except hub_errors.RepositoryNotFoundError:
            raise KvbenchError(
                f"no model {repo_id} on the Hugging Face Hub (a private one needs a login: hf auth login or HF_TOKEN)"
            ) from None
        except hub_errors.RevisionNotFoundError:
            raise KvbenchError(f"{repo_id} has no revision {revision!r} on the Hugging Face Hub") from None
        except hub_errors.EntryNotFoundError:
            raise KvbenchError(
                f"{repo_id} has no config.json (a GGUF-only repository: download its .gguf file and "
                "pass the file's path)"
            ) from None
        except hub_errors.HFValidationError as err:
            raise KvbenchError(f"{repo_id!r} is not a valid Hugging Face model id: {_first_line(err)}") from None
        except Exception as err:  # noqa: BLE001 - no answer from the Hub (network, proxy, server): use the cache
            path = cached()
            if path is not None:
                return path
            raise KvbenchError(
                f"{repo_id}: the Hugging Face Hub cannot be reached ({_first_line(err)}) and "
                f"config.json is not in {where}: connect once (or set HF_ENDPOINT to a mirror), "
                "or pass a local checkpoint directory"
            ) from None


@contextmanager
def _quiet_hub() -> Iterator[None]:
    """huggingface_hub's warnings (retries, fall-backs) held back: kvbench says what happened in its own line."""
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.ERROR + 10)
    try:
        yield
    finally:
        logger.setLevel(level)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
