"""What the command lines share (``python -m holotron.generate`` in generate.py, ``python -m holotron.eval`` in
eval.py): the one-line error class, the --device / --dtype checks, the --out checks made before a model is
loaded, and writing a file through a temporary one that honours the umask."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .atomic_folder import umask

__all__ = ["CLIError", "cli_device", "cli_dtype", "check_out_file", "check_out_dir", "write_atomically"]


class CLIError(Exception):
    """A problem the user can fix; printed as one line."""


def cli_device(name: str):
    """--device as a torch.device this machine has (auto: cuda when torch sees a GPU, else cpu)."""
    from .devices import DeviceError, resolve_device

    try:
        return resolve_device(name, label=f"--device {name}", use_cpu="--device cpu")
    except DeviceError as e:
        raise CLIError(str(e)) from None


def cli_dtype(name: str, device):
    """--dtype as a torch dtype (auto: bfloat16 on cuda, float32 on cpu)."""
    from .devices import DeviceError, resolve_dtype

    try:
        return resolve_dtype(name, device, label="--dtype")
    except DeviceError as e:
        raise CLIError(str(e)) from None


def _probe_writable(folder: Path, flag: str, path) -> None:
    """Create and remove a file in ``folder``: the only test that holds for root, read-only mounts and ACLs."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".holotron-probe-", dir=str(folder))
    except OSError as e:
        raise CLIError(f"{flag} {path}: cannot write in {folder} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(tmp)


def check_out_file(path, flag: str = "--out", suffixes: dict[str, str] | None = None) -> Path:
    """The file ``path`` can be written (its folder exists and takes files, it is not a folder, it is not
    read-only); with ``suffixes`` (suffix -> format) its suffix is one of them. Checked before any work."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise CLIError(f"{flag} {path}: is a folder; give a file name")
    if suffixes is not None and p.suffix.lower() not in suffixes:
        names = sorted(dict.fromkeys(suffixes))
        raise CLIError(f"{flag} {path}: use a file name ending in {', '.join(names[:-1])} or {names[-1]}")
    parent = p.parent
    if not parent.exists():
        raise CLIError(f"{flag} {path}: folder {parent} does not exist")
    if not parent.is_dir():
        raise CLIError(f"{flag} {path}: {parent} is not a folder")
    if p.exists() and not os.access(p, os.W_OK):
        raise CLIError(f"{flag} {path}: the file is read-only")
    _probe_writable(parent, flag, path)
    return p


def check_out_dir(path, flag: str = "--out") -> Path:
    """The folder ``path`` exists and takes files, or can be created (its nearest existing parent takes them)."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise CLIError(f"{flag} {path}: is a file; give a folder (it is created if missing)")
    existing = p
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise CLIError(f"{flag} {path}: {existing} is a file, not a folder")
    _probe_writable(existing, flag, path)
    return p


def write_atomically(path: Path, write) -> None:
    """``write(tmp_path)`` next to ``path``, then rename: a failure leaves nothing half-written. The file
    gets the permissions a plain open() would give (0o666 less the umask), not mkstemp's 0o600."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
