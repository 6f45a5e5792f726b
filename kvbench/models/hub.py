"""A model's ``config.json`` by Hugging Face Hub id (``meta-llama/Llama-3.1-8B-Instruct``), through huggingface_hub.

Only ``config.json`` is fetched: no weights, no tokenizer, no remote code. With ``HF_HUB_OFFLINE=1`` the local
cache alone is read; without it the Hub is asked and, when it cannot be reached, the cached copy is used. When
neither gives the file, one line says which and what to do. The environment is read at each call (not when
huggingface_hub was imported), so a process that changes ``HF_HUB_OFFLINE`` or ``HF_HUB_CACHE`` is obeyed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from kvbench.errors import KvbenchError

# owner/name as the Hub spells repositories: letters, digits, '-', '_', '.'; neither part starts with '.' or '-'
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9_][\w.-]{0,95}")
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
    """The local path of ``repo_id``'s ``config.json``: from the cache, downloaded into it when online."""
    try:
        from huggingface_hub import errors as hub_errors
        from huggingface_hub import hf_hub_download
    except ImportError:  # pragma: no cover - a dependency of transformers, so normally present
        raise KvbenchError(f"{repo_id} looks like a Hugging Face model id, but huggingface_hub is not installed: "
                           "pip install huggingface_hub, or pass a local checkpoint directory") from None
    cache = cache_dir()
    where = f"the local Hugging Face cache ({cache})"
    try:
        return Path(hf_hub_download(repo_id, "config.json", revision=revision, cache_dir=cache,
                                    local_files_only=offline()))
    except hub_errors.GatedRepoError:
        raise KvbenchError(f"{repo_id} is a gated model and {where} has no copy of its config.json: accept its "
                           "license on huggingface.co, then log in (hf auth login, or set HF_TOKEN)") from None
    except hub_errors.RepositoryNotFoundError:
        raise KvbenchError(f"no model {repo_id} on the Hugging Face Hub (a private one needs a login: hf auth login "
                           "or HF_TOKEN)") from None
    except hub_errors.RevisionNotFoundError:
        raise KvbenchError(f"{repo_id} has no revision {revision!r} on the Hugging Face Hub") from None
    except hub_errors.RemoteEntryNotFoundError:
        raise KvbenchError(f"{repo_id} has no config.json (a GGUF-only repository: download its .gguf file and "
                           "pass the file's path)") from None
    except (hub_errors.LocalEntryNotFoundError, hub_errors.OfflineModeIsEnabled):
        if offline():
            raise KvbenchError(f"{repo_id}: config.json is not in {where}, and HF_HUB_OFFLINE=1 forbids asking the "
                               "Hub: unset HF_HUB_OFFLINE once, or pass a local checkpoint directory") from None
        raise KvbenchError(f"{repo_id}: the Hugging Face Hub cannot be reached and config.json is not in {where}: "
                           "connect once (or set HF_ENDPOINT to a mirror), or pass a local checkpoint directory"
                           ) from None
    except hub_errors.HFValidationError as err:
        raise KvbenchError(f"{repo_id!r} is not a valid Hugging Face model id: {_first_line(err)}") from None
    except (hub_errors.HfHubHTTPError, OSError, ValueError) as err:
        raise KvbenchError(f"{repo_id}: cannot read config.json from the Hugging Face Hub: {_first_line(err)}"
                           ) from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
