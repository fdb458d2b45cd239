"""Files that several processes share: written atomically under a lock; and whether a pid
file's process is alive.

A writer makes a temporary file in the same directory, fsyncs it and renames it over the
target, holding ``<path>.lock`` (filelock) against other writers. A reader needs no lock: it
opens the old file or the new, never half of one (and leaves no lock file beside a path it
was only asked to read).
Used for models (classes, knowledge base, memory predictor) that the daemon and
``slurm-gpushare ... fit`` share.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from filelock import FileLock

LOCK_TIMEOUT_S = 30


def lock_for(path: str | os.PathLike) -> FileLock:
    return FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S)


@contextlib.contextmanager
def replacing(path: str | os.PathLike, *, mode: int | None = None,
              binary: bool = False) -> Iterator[IO]:
    """A file that takes ``path``'s place only once it is complete: a temporary file in the
    same directory, fsynced and renamed over it (the caller holds the lock where several
    writers may race). A failure half-way leaves the old file as it was. Born with ``mode``
    (never briefly wider); None: the old file's, or what ``open`` gives a new one. A symlink
    is written through to its target, as ``open`` writes."""
    path = os.path.realpath(path)
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path),
                               prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with open(fd, "wb" if binary else "w") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def replace_atomically(path: str | os.PathLike, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` (its directory made if need be) with ``replacing``."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with replacing(path, mode=mode, binary=True) as handle:
        handle.write(data)


def _stat(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat`` from field 3 (state) on, or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat`` field 22), or
    None if there is no such process. With the pid it names one process: pids are reused (by
    default only 32768 of them), a pid and its start time are not."""
    fields = _stat(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int, started: int | None = None) -> bool:
    """Whether a process with this pid exists (one of another user's counts), is not a zombie
    (exited, not yet reaped: orphans under a container's init may stay so) and, when
    ``started`` is given (``process_started`` when it was recorded), is still that process
    rather than a later one given the same pid."""
    if pid <= 0:  # kill(0, ...) would signal our own process group
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = _stat(pid)
    if not fields:
        return True  # no /proc to read: the signal said it exists
    if fields[0] == b"Z":
        return False
    return started is None or len(fields) < 20 or fields[19] == str(started).encode()


def write_locked(path: str | os.PathLike, data: bytes | str) -> None:
    """Replace ``path`` atomically under its lock."""
    with lock_for(path):
        replace_atomically(path, data.encode() if isinstance(data, str) else data)

