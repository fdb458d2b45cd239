"""Slurm 24.11 for the test cluster: Debian trixie's Slurm packages in a root of their own.

The host runs Debian bookworm (Slurm 22.05). For 24.11 the test cluster builds a trixie root
with ``mmdebstrap`` from Debian's registry once (cached, rebuilt when missing or incomplete) and
runs Slurm's daemons and clients inside it with ``chroot``. Each command enters through one
generated script, ``enter``, which makes a *private mount namespace* (``unshare --mount``),
bind-mounts /dev, /proc, /sys, /tmp, the cluster's state directory and the checkout at their
own paths (so every path in slurm.conf, the hook's socket, the fake GPU files and a batch script
under /tmp mean the same on both sides), then chroots. The mounts exist only for that command and the processes it leaves
running: they vanish with them, are never visible on the host, and a ``rm -rf`` of the state
directory cannot reach through them into the host's /dev or the checkout.

Munge and MariaDB are the host's (their protocols do not depend on Slurm's version): the root's
Slurm talks to the host's munged through the socket in the state directory and to MariaDB over
TCP on 127.0.0.1, as Slurm does on any site.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from filelock import FileLock

# What the root holds: Slurm's daemons and clients, the hook's Lua libraries, and a Python for
# the node side (prolog agent, fake GPU jobs), which imports only these from outside the checkout.
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge", "lua-socket",
            "lua-cjson", "python3", "python3-filelock", "python3-click")
SUITE = "trixie"
MIRROR = "http://deb.debian.org/debian"
CLIENTS = ("sbatch", "srun", "salloc", "squeue", "sinfo", "sacct", "sacctmgr", "scontrol",
           "scancel", "sstat", "sprio", "sshare", "sreport", "sdiag")
COMPLETE = ".gpushare-root-complete"  # written last: a root without it is rebuilt
BUILD_TIMEOUT_S = 1800  # waiting for another build (downloads ~100 MB from Debian's registry)


class RootError(RuntimeError):
    """The Slurm root could not be built or entered."""


class SlurmRoot:
    def __init__(self, path: Path, binds: tuple[Path, ...]):
        self.path = path
        paths = sorted({b.resolve() for b in binds})
        # A path inside another bound path is already there.
        self.binds = tuple(p for p in paths if not any(o != p and o in p.parents for o in paths))

    @property
    def complete(self) -> bool:
        return (self.path / COMPLETE).exists()

    def ensure(self, log: Path) -> float | None:
        """Build the root unless a complete one is there; the seconds it took, or None.

        One build at a time: a second caller (``make test`` builds the root in the background
        while the unit tests run, then starts the 24.11 cluster) waits for the first."""
        if self.complete:
            return None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock", timeout=BUILD_TIMEOUT_S):
            return None if self.complete else self._build(log)

    def _build(self, log: Path) -> float:
        if shutil.which("mmdebstrap") is None:
            raise RootError("mmdebstrap is missing: run scripts/install-deps.sh (as root)")
        started = time.monotonic()
        partial = self.path.with_name(self.path.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.parent.mkdir(parents=True, exist_ok=True)
        argv = ["mmdebstrap", "--variant=apt", "--include=" + ",".join(PACKAGES),
                *(f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "locale")),
                SUITE, str(partial), MIRROR]
        with open(log, "ab") as out:
            result = subprocess.run(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
        if result.returncode:
            shutil.rmtree(partial, ignore_errors=True)
            raise RootError(f"building the {SUITE} root failed (exit {result.returncode}); "
                            f"see {log}")
        for bind in self.binds:  # mount points for the bind mounts
            (partial / bind.relative_to("/")).mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.path, ignore_errors=True)
        partial.rename(self.path)
        (self.path / COMPLETE).write_text(f"{SUITE} {' '.join(PACKAGES)}\n")
        return time.monotonic() - started

    def slurm_version(self) -> str:
        """The Slurm version the root holds (from its package database, no mounts needed)."""
        status = (self.path / "var/lib/dpkg/status").read_text(errors="replace")
        for block in status.split("\n\n"):
            if block.startswith("Package: slurmctld\n"):
                for line in block.splitlines():
                    if line.startswith("Version: "):
                        return line.split(" ", 1)[1]
        raise RootError(f"no slurmctld in {self.path}")

    def write_entry(self, enter: Path, bin_dir: Path, hosts: Path) -> None:
        """Write ``enter`` (run a command in the root) and one client wrapper per Slurm client;
        ``hosts`` is bound over the root's ``/etc/hosts`` (the cluster's ``hosts_file``)."""
        for bind in self.binds:
            (self.path / bind.relative_to("/")).mkdir(parents=True, exist_ok=True)
        binds = " ".join(f"'{b}'" for b in self.binds)
        text = f"""#!/bin/sh
# Generated by slurm-gpushare's test cluster: run a command inside the Slurm root
# {self.path}
# in a private mount namespace (the mounts vanish with the command's processes).
# Usage: enter [--user NAME] COMMAND [ARGS...]; the working directory is kept.
user=
if [ "$1" = --user ]; then user=$2; shift 2; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "$0: the Slurm root needs root (mount namespace, chroot)" >&2; exit 1
fi
exec unshare --mount --propagation private -- /bin/sh -c '
  set -e
  root=$1 user=$2 cwd=$3; shift 3
  # Recursive, and before /dev, /proc and /sys: what is mounted below a bound directory
  # comes too (a multi-host test node binds its own run and spool over those of the
  # cluster), but not the /dev, /proc and /sys of the root where it lies below one (/tmp).
  for dir in {binds}; do mount --rbind "$dir" "$root$dir"; done
  for fs in dev proc sys; do mount --rbind "/$fs" "$root/$fs"; done
  # The names of the hosts: srun, slurmctld and slurmstepd address each other by name
  # (unresolvable, every step completion is retried for minutes and nodes drain), and
  # slurmctld 24.11 looks up the name of every peer address that connects to it.
  # (No single quotes in this script: it is one quoted argument.)
  mount --bind {hosts} "$root/etc/hosts"
  set +e
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin; export PATH
  if [ -n "$user" ]; then
    exec chroot "$root" runuser -u "$user" -- /bin/sh -c "cd \\"\\$0\\" 2>/dev/null || cd /; exec \\"\\$@\\"" "$cwd" "$@"
  fi
  exec chroot "$root" /bin/sh -c "cd \\"\\$0\\" 2>/dev/null || cd /; exec \\"\\$@\\"" "$cwd" "$@"
' enter '{self.path}' "$user" "$PWD" "$@"
"""
        _write_exec(enter, text)
        bin_dir.mkdir(parents=True, exist_ok=True)
        for client in CLIENTS:
            _write_exec(bin_dir / client, f'#!/bin/sh\nexec \'{enter}\' /usr/bin/{client} "$@"\n')


def _write_exec(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.rename(path)
