"""A folder written all at once: checked before anything is written, filled in a temporary folder, moved
into place at the end, removed on failure (``save_pretrained`` in ``holotron/weights.py`` writes through it).

    with atomic_folder("out/ckpt", who="save_pretrained", stale=lambda name: name.endswith(".safetensors")) as tmp:
        (tmp / "config.json").write_text(...)       # a failure here leaves "out/ckpt" as it was

Before the body runs, the target is checked: an existing file where the folder should be, a parent that
is a file, or a folder that cannot be written raises an OSError of one line naming the caller's path
(never the temporary one). The temporary folder lies beside a folder that does not exist yet (renamed
onto it at the end) or inside one that does (its files moved in one by one, on the same file system),
and parents created for it are removed again on failure. Files and folders end with the modes the
process umask gives (0666 / 0777 minus the umask), whatever the writers used (safetensors writes 0600).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["atomic_folder", "umask"]


def umask() -> int:
    """The process umask, read without changing it where /proc allows (else set and restored at once)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def _error(e: BaseException, msg: str) -> OSError:
    """An OSError of ``e``'s class (when it can be made from a message) carrying ``msg`` and ``e``'s errno."""
    try:
        out = type(e)(msg) if isinstance(e, OSError) else OSError(msg)
    except Exception:  # noqa: BLE001 - a subclass with another constructor
        out = OSError(msg)
    out.errno = getattr(e, "errno", None)
    return out


def _check(folder: Path, who: str) -> list[Path]:
    """Raise unless ``folder`` can be written; returns the missing parents (outermost first) it needs."""
    if folder.exists():
        if not folder.is_dir():
            raise NotADirectoryError(f"{who}: {folder} exists and is not a folder")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(f"{who}: cannot write into {folder}: permission denied")
        return []
    missing, anc = [], folder.parent
    while not anc.exists() and anc != anc.parent:
        missing.append(anc)
        anc = anc.parent
    if not anc.is_dir():
        raise NotADirectoryError(f"{who}: cannot create {folder}: {anc} is a file, not a folder")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise PermissionError(f"{who}: cannot create {folder}: {anc} is not writable")
    return missing[::-1]


def _clean(text: str, tmp: Path, folder: Path) -> str:
    """An error's first line with the temporary folder's name replaced by the caller's."""
    line = (text.strip().splitlines() or [""])[0]
    line = re.sub(r' at path "[^"]*"', "", line)  # safetensors names its own temporary file
    return line.replace(str(tmp), str(folder))


def _set_modes(tmp: Path, mask: int) -> None:
    for p in tmp.rglob("*"):
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


@contextlib.contextmanager
def atomic_folder(folder, *, who: str = "write", stale: Callable[[str], bool] = lambda name: False) -> Iterator[Path]:
    """Yield an empty temporary folder; on success its contents become ``folder``'s (files of an existing
    folder that this write did not replace and ``stale(name)`` accepts are removed); on failure nothing
    changes. Errors are OSErrors of one line naming ``folder``."""
    folder = Path(folder)
    try:
        missing = _check(folder, who)
    except OSError as e:
        if e.errno is None:  # one of _check's own messages
            raise
        raise _error(e, f"{who}: cannot write {folder}: {e.strerror or type(e).__name__}") from None
    exists = not missing and folder.is_dir()
    made: list[Path] = []
    tmp = None
    try:
        for p in missing:
            p.mkdir()
            made.append(p)
        home = folder if exists else folder.parent
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-" if not exists else ".tmp-", dir=home))
        yield tmp
        mask = umask()
        _set_modes(tmp, mask)
        if not exists:
            os.chmod(tmp, 0o777 & ~mask)
            os.replace(tmp, folder)
            tmp = None
            return
        written = {p.name for p in tmp.iterdir()}
        for p in tmp.iterdir():
            os.replace(p, folder / p.name)
        for old in folder.iterdir():  # what an earlier write left that this one did not overwrite
            if old.name not in written and old.is_file() and stale(old.name):
                old.unlink()
    except Exception as e:
        io = isinstance(e, OSError) or (type(e).__name__ == "SafetensorError" and "I/O error" in str(e))
        if not io:
            raise
        if tmp is None:  # making the parents or the temporary folder: the OS names a path the caller never gave
            where = f"cannot create {folder}" if not exists else f"cannot write into {folder}"
            why = getattr(e, "strerror", None) or _clean(str(e), folder, folder)
            raise _error(e, f"{who}: {where}: {why}") from None
        raise _error(e, f"{who}: cannot write {folder}: {_clean(str(e), tmp, folder)}") from None
    finally:
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if tmp is not None or not folder.exists():
            for p in reversed(made):  # parents made for a write that did not happen
                with contextlib.suppress(OSError):
                    p.rmdir()
