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
            url = hf_hub_url(repo_id, "config.json", revision=revision, endpoint=endpoint)
            _check_answer(repo_id, url, get_hf_file_metadata(url))
            return Path(hf_hub_download(repo_id, "config.json", revision=revision, cache_dir=cache, endpoint=endpoint))
        except KvbenchError:  # an answer refused by _check_answer: said as it is, not as an unreachable Hub
            raise
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


_GIT_HASH = re.compile(r"[0-9a-f]{40}")  # a commit, or the blob of a file kept in git
_ETAG = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # a git blob's hash, or an LFS/Xet file's sha256
_HUB_CDN = (".hf.co", ".huggingface.co")  # where huggingface.co sends large files


def _check_answer(repo_id: str, url: str, metadata) -> None:
    """Refuse a Hub answer before huggingface_hub stores anything by it: a redirect away from http(s) or to
    another host (the Hub's own CDN aside), and a commit or ETag that is not a hash. huggingface_hub builds cache
    paths from those two, so ``../`` in one would make it write outside the cache."""
    from urllib.parse import urlsplit

    asked, location = urlsplit(url), urlsplit(metadata.location or url)
    if location.scheme not in ("http", "https"):
        raise KvbenchError(
            f"{repo_id}: the Hub at {asked.scheme}://{asked.netloc} redirected config.json to a {location.scheme}: "
            "address; kvbench reads it only over http(s) (check HF_ENDPOINT)"
        )
    host = (location.hostname or "").lower()
    if host != (asked.hostname or "").lower() and not host.endswith(_HUB_CDN):
        raise KvbenchError(
            f"{repo_id}: the Hub at {asked.scheme}://{asked.netloc} redirected config.json to another host "
            f"({location.hostname}); kvbench follows no redirect off the Hub (check HF_ENDPOINT)"
        )
    for what, value, form in (("a commit", metadata.commit_hash, _GIT_HASH), ("an ETag", metadata.etag, _ETAG)):
        if not isinstance(value, str) or not form.fullmatch(value):
            raise KvbenchError(
                f"{repo_id}: the Hub at {asked.scheme}://{asked.netloc} answered config.json with {what} that "
                f"is not a hash ({ascii(str(value))[:80]}); refused before anything is stored (check HF_ENDPOINT)"
            )


@contextmanager
def _quiet_hub() -> Iterator[None]:
    """huggingface_hub's warnings (retries, fall-backs) held back: kvbench says what happened in its own line.
    Its offline switch follows ``HF_HUB_OFFLINE`` as it is now: the library reads it once, at import, so a process
    that imported it offline would otherwise stay offline."""
    from huggingface_hub import constants

    logger = logging.getLogger("huggingface_hub")
    level, was_offline = logger.level, constants.HF_HUB_OFFLINE
    logger.setLevel(logging.ERROR + 10)
    constants.HF_HUB_OFFLINE = offline()
    try:
        yield
    finally:
        logger.setLevel(level)
        constants.HF_HUB_OFFLINE = was_offline


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
