"""A private munged with a fresh key, for tests and benchmarks of munge-sealed deliveries
(two of them are two realms: each refuses the other's credentials)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path


def start_munged(root: Path, threads: int | None = None) -> str:
    """Start munged under ``root`` (key, socket, pid, log, seed); return its socket path.
    Its pid is in ``root/munged.pid``."""
    root.mkdir(parents=True)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    sock = root / "munge.socket"
    subprocess.run(["munged", "--force", f"--socket={sock}", f"--key-file={key}",
                    f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log",
                    f"--seed-file={root}/munged.seed",
                    *([f"--num-threads={threads}"] if threads else [])], check=True, timeout=30)
    deadline = time.monotonic() + 10
    while not sock.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"munged did not start; see {root}/munged.log")
        time.sleep(0.02)
    return str(sock)
