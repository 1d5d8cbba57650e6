"""Where a model lives: a local folder, a model shipped inside the package, or a Hugging Face Hub
snapshot (read from the local cache, fetched when missing unless offline). The one resolver that
``holotron.load`` and ``Processor.from_pretrained`` share; each passes the files it needs and the
error class its callers catch.

Never fetches code (``*.py``); reads HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE and the cache location
(HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME) from the environment as it is at the call, not as it was
when huggingface_hub was imported."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

__all__ = ["resolve", "hub_offline", "hub_cache_dir", "REPO_ID", "NEVER_FETCH"]

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?$")
NEVER_FETCH = ("*.py", "*.pyc")


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE), read now."""
    return _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE")


def hub_cache_dir() -> Path:
    """The hub cache folder from the environment as it is now (HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME)."""
    env = os.environ
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if not cache:
        home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
        cache = os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(cache)))


def resolve(path_or_repo_id, *, allow_patterns: Sequence[str], ignore_patterns: Sequence[str] = NEVER_FETCH,
            revision: str | None = None, cache_dir=None, file_ok=lambda p: False,
            error: type[Exception] = FileNotFoundError) -> Path:
    """A local folder for ``path_or_repo_id``: the folder itself; a bundled model's folder; the folder of a
    file that ``file_ok(path)`` accepts (e.g. a checkpoint's config.json); else a Hub snapshot holding only
    ``allow_patterns`` (minus ``ignore_patterns``, which always include ``*.py``). Every failure raises
    ``error`` with one line naming the model and what to do."""
    text = os.fspath(path_or_repo_id)
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    from .bundled import bundled_path

    if (b := bundled_path(text)) is not None:
        return b
    if path.is_file():
        if file_ok(path):
            return path.parent
        raise error(f"{text}: is a file; pass the checkpoint folder (config.json + *.safetensors)")
    if text.startswith((".", "/", "~")) or not REPO_ID.match(text):
        raise error(f"{text}: no such folder (and not a Hugging Face repo id)")
    offline = hub_offline()
    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    try:
        from huggingface_hub import snapshot_download

        folder = snapshot_download(text, revision=revision, cache_dir=str(cache), local_files_only=offline,
                                   allow_patterns=list(allow_patterns),
                                   ignore_patterns=list(dict.fromkeys([*NEVER_FETCH, *ignore_patterns])))
    except Exception as e:  # noqa: BLE001 - every hub failure becomes one clear line; the cause stays chained
        if offline:
            raise error(f"{text}: not a local folder, and HF_HUB_OFFLINE is set and it is not in the local cache "
                        f"{cache}: download it first (`hf download {text}`) or pass a local folder") from e
        cause = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise error(f"{text}: not a local folder, and the Hub could not provide it nor the cache {cache} "
                    f"({type(e).__name__}: {cause})") from e
    return Path(folder)
