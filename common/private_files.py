"""Writing secrets to files: keys, certificates, credentials, bundles.

Used by the switch, the worker side, the control plane (its secret, the audit anchor key)
and the command alike, so it lives apart from all of them and imports nothing of the project.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Never through a link someone planted, never onto a file that already exists.
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _temporary_name(target: Path) -> Path:
    """A name beside `target` that nobody can guess ahead of the write."""
    return target.with_name(f".{target.name}.{secrets.token_hex(16)}.tmp")


@contextmanager
def _staged(target: Path, data: bytes) -> Iterator[Path]:
    """A new file beside `target` holding `data`, complete on disk, gone again on the way out.

    The caller gives it `target`'s name (by a rename or a link); whatever is still there on
    the way out is removed. A missing folder is made with mode 0700.
    """
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = _temporary_name(target)
    fd = os.open(tmp, _NEW_FILE, 0o600)
    try:
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def write_private_file(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` with mode 0600, atomically (a new temporary file, then a rename).

    The temporary file is created (O_EXCL, O_NOFOLLOW) under a random name, so a link
    planted beside the target can neither redirect the write nor be followed by it: the
    open fails instead. The rename replaces `path` itself, a link there included, never
    what a link points at. A missing folder is made with mode 0700.
    """
    target = Path(path)
    with _staged(target, data) as tmp:
        os.replace(tmp, target)


def create_private_file(path: str | os.PathLike[str], data: bytes) -> None:
    """Create `path` holding `data` with mode 0600; FileExistsError when anything is there.

    Never replaces: for a file made once and then only read (a key, the platform secret).
    The data is complete before the file has its name (a new temporary file, then a hard
    link), so processes racing to create it all read the one that was linked first. A link
    planted at `path` is not followed: it is something there. A missing folder is made with
    mode 0700.
    """
    target = Path(path)
    with _staged(target, data) as tmp:
        os.link(tmp, target)


def make_private_folder(path: Path) -> None:
    """Make `path` with mode 0700; FileExistsError when anything (a folder, a link) is there."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.mkdir(path, 0o700)
    os.chmod(path, 0o700, follow_symlinks=False)  # whatever the umask took away
