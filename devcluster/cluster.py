"""A real local Slurm cluster for the demo, the integration tests and the benchmarks.

Debian's Slurm daemons, all on this host: 22.05 (bookworm, the host's packages) by default, or
24.11 (trixie, in a root of its own: see ``devcluster/slurmroot.py``) with
``GPUSHARE_SLURM=24.11``. All all state under one directory (nothing in
/etc is touched): munged, MariaDB + slurmdbd (accounting), slurmctld with the project's
``slurm_gpushare/lua/job_submit.lua``, four slurmd in multiple-slurmd mode with fake GPUs of two types
(2 nodes x 2 "v100" 16 GiB, 2 nodes x 2 "a100" 80 GiB, sharing by shards, one shard = 1 GiB;
1 node x 2 "t4" 16 GiB sharing by MPS), and the
predictor daemon. Start, stop and status are idempotent; readiness is polled, never slept.

Test-cluster choices (see the README for a production install):
* SlurmUser is root, so the daemons, the hook and the predictor can run from a checkout
  anywhere (a checkout under /root is unreadable for the ``slurm`` user).
* ``proctrack/linuxproc`` and ``task/none``: no cgroups needed inside containers.
* Fake GPUs are plain files (gres.conf ``File=`` only needs something to stat).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import click

from slurm_gpushare import HOOK_DIR
from slurm_gpushare.core.files import pid_alive, process_started, replace_atomically
from slurm_gpushare.core.config import load_config
from devcluster.fakegpu import ROOT_ENV as FAKEGPU_ROOT_ENV
from devcluster.fakegpu import write_board
from devcluster.slurmroot import RootError, SlurmRoot

REPO = Path(__file__).resolve().parent.parent
DEFAULT_STATE_DIR = "/tmp/slurm-gpushare-cluster"
STATE_ENV = "GPUSHARE_CLUSTER_DIR"
CLUSTER_NAME = "gpushare"

PORT_BASE_ENV = "GPUSHARE_CLUSTER_PORT_BASE"
SLURM_ENV = "GPUSHARE_SLURM"  # which Slurm: "22.05" (the host's) or "24.11" (trixie root)
SLURM_VERSIONS = ("22.05", "24.11")
ROOT_CACHE_ENV = "GPUSHARE_ROOT_CACHE"  # where the trixie root is kept (default: state dir)
# A 24.11 cluster lives beside the 22.05 one (own subdirectory, own ports), so both can be up.
PORT_OFFSET_24_11 = 500


def cluster_ports(base: int) -> dict[str, int]:
    """TCP ports of one test cluster; a second cluster on the same host needs another base."""
    return {"slurmctld": base + 17, "slurmdbd": base + 19, "mariadb": base + 6,
            "slurmd_base": base + 201}


@dataclass(frozen=True)
class FakeNode:
    name: str
    gpu_type: str
    gpus: int
    memory_gib: int  # per GPU; shards per GPU = memory_gib
    cpus: int = 8
    sharing: str = "shard"  # or "mps": Slurm allows one sharing gres per node

    @property
    def sharing_count(self) -> int:
        """gres Count of its sharing gres: 1 shard per GiB, or 100 MPS percent per GPU."""
        return self.gpus * (self.memory_gib if self.sharing == "shard" else 100)

    @property
    def features(self) -> str:
        return f"{self.gpu_type},gpumem{self.memory_gib}g"


NODES = (
    FakeNode("v100-1", "v100", 2, 16),
    FakeNode("v100-2", "v100", 2, 16),
    FakeNode("a100-1", "a100", 2, 80),
    FakeNode("a100-2", "a100", 2, 80),
    FakeNode("t4-1", "t4", 2, 16, cpus=4, sharing="mps"),
)
GPU_MODELS = {"v100": "V100-16GB", "a100": "A100-80GB", "t4": "T4"}
# What NVML would call the fake GPUs, and the memory it would report (MiB).
NVML_NAMES = {"v100": ("Tesla V100-SXM2-16GB", 16160), "a100": ("NVIDIA A100-SXM4-80GB", 81920),
              "t4": ("Tesla T4", 15360)}


class ClusterError(click.ClickException):
    """The test cluster could not be brought up or queried."""


def _wait_until(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    """Poll ``check`` until it is true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except (OSError, subprocess.SubprocessError):
            pass
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def _pid_alive(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if not pid_alive(pid):  # (a zombie is not alive either)
        return None
    # A recycled pid of another program must not count as running: the daemon wrote its pid
    # file after it started, a process that took the pid later started after the file.
    started = process_started(pid)
    try:
        written = pid_file.stat().st_mtime
    except OSError:
        return None
    if started is not None and _BOOT_TIME + started / _TICKS_PER_S > written + 2:
        return None
    return pid


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


_BOOT_TIME = _boot_time()
_SLURM_DAEMONS = ("slurmctld", "slurmdbd", "slurmd")
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


class TestCluster:
    __test__ = False  # not a pytest test class

    def __init__(self, state_dir: str | os.PathLike | None = None, *, python: str | None = None,
                 slurm: str | None = None):
        base = Path(state_dir or os.environ.get(STATE_ENV) or DEFAULT_STATE_DIR).resolve()
        self.slurm_version = slurm or os.environ.get(SLURM_ENV) or "22.05"
        if self.slurm_version not in SLURM_VERSIONS:
            raise ClusterError(f"{SLURM_ENV}={self.slurm_version}: the test cluster runs Slurm "
                               f"{' or '.join(SLURM_VERSIONS)}")
        port_base = int(os.environ.get(PORT_BASE_ENV, "16800"))
        self.python = python or sys.executable
        self.node_python = self.python  # the Python of prolog agents and jobs
        self.slurm_root: SlurmRoot | None = None
        root = base
        if self.slurm_version == "24.11":
            root = base / "slurm-24.11"
            port_base += PORT_OFFSET_24_11
            cache = Path(os.environ.get(ROOT_CACHE_ENV) or base / "roots").resolve()
            self.slurm_root = SlurmRoot(cache / "trixie-slurm-24.11", binds=(Path("/tmp"), base, REPO))
            self.node_python = "/usr/bin/python3"  # the root's; the host's venv is not there
        self.nodes = NODES
        self._place(root, port_base)

    def _place(self, root: Path, port_base: int) -> None:
        """Where this cluster keeps its state and which ports it uses."""
        self.root = root
        self.port_base = port_base
        self.etc = self.root / "etc"
        self.log = self.root / "log"
        self.run = self.root / "run"
        self.ports = cluster_ports(port_base)

    # ---- paths and environment -------------------------------------------------------------
    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.run / "munge.socket"

    @property
    def daemon_socket(self) -> Path:
        return self.run / "gpushare.sock"

    @property
    def fakegpu_root(self) -> Path:
        return self.root / "fakegpu"

    def training_script(self, *, work_s: float | dict[str, float], util: float = 50.0,
                        mem_util: float = 20.0, mem_mib: dict[str, float] | None = None) -> str:
        """A job script that "trains" on its fake GPU (see devcluster/fakegpu.py); ``work_s``
        as seconds on every GPU type, or per type."""
        mem = " ".join(f"--mem {t}:{m:g}" for t, m in (mem_mib or {"v100": 6000}).items())
        work = (" ".join(f"--work {t}:{w:g}" for t, w in work_s.items())
                if isinstance(work_s, dict) else f"--work {work_s:g}")
        return ("#!/bin/sh\n# an ordinary training job on the test cluster's fake GPUs\n"
                f"export {FAKEGPU_ROOT_ENV}={self.fakegpu_root} PYTHONPATH={REPO}\n"
                f"exec {self.node_python} -m devcluster.fakegpu run "
                f"{work} --util {util:g} --mem-util {mem_util:g} {mem}\n")

    @property
    def daemon_config(self) -> Path:
        return self.etc / "gpushare.toml"

    @property
    def gres_prefix(self) -> str:
        """How this version's clients (and so the rewrites) spell gres in ``tres_per_*``."""
        return "gres/" if self.slurm_version == "24.11" else "gres:"

    @property
    def enter(self) -> Path:
        """The script that runs a command inside the Slurm root (24.11 only)."""
        return self.root / "enter"

    @property
    def client_bin(self) -> Path:
        """Wrappers named like Slurm's clients that run the root's (24.11 only)."""
        return self.root / "bin"

    def client_environ(self) -> dict[str, str]:
        """What a process needs in its environment to use this cluster's Slurm clients."""
        env = {"SLURM_CONF": str(self.slurm_conf)}
        if self.slurm_root:
            env["PATH"] = f"{self.client_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        return env

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.client_environ())
        env.pop("SLURM_JOB_ID", None)
        return env

    def in_root(self, argv: list[str], user: str | None = None) -> list[str]:
        """``argv`` as run where Slurm runs: inside the root for 24.11, as is for 22.05."""
        if self.slurm_root:
            return [str(self.enter), *(["--user", user] if user else []), *argv]
        return ["runuser", "-u", user, "--", *argv] if user else list(argv)

    def slurm(self, *args: str, check: bool = True, timeout: float = 30, input: str | None = None,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster."""
        result = subprocess.run(list(args), env={**self.env(), **(env or {})}, input=input,
                                capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise ClusterError(f"{' '.join(args)}: {(result.stderr or result.stdout).strip()}")
        return result

    # ---- configuration ---------------------------------------------------------------------
    def write_config(self) -> None:
        for sub in ("etc", "log", "run", "ctld", "spool", "munge", "mysql", "dev", "jobs",
                    "predictor", "fakegpu"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            devdir = self.root / "dev" / node.name
            devdir.mkdir(parents=True, exist_ok=True)
            for index in range(node.gpus):
                (devdir / f"nvidia{index}").touch()
            name, total = NVML_NAMES[node.gpu_type]
            write_board(self.fakegpu_root, node.name, node.gpu_type,
                        [{"index": i, "name": name, "mem_total_mib": total}
                         for i in range(node.gpus)])
        # Telemetry collection: prolog/epilog wrappers that point the agent at this cluster.
        self._write(self.etc / "gpushare-agent.env", "\n".join([
            "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
            f"SLURM_CONF={self.slurm_conf}",
            f"GPUSHARE_PYTHON={self.node_python}",
            *self._agent_delivery_env(),
            f"GPUSHARE_FAKEGPU_ROOT={self.fakegpu_root}",
            "GPUSHARE_TELEMETRY_PROVIDER=devcluster.fakegpu:provider",
            f"PYTHONPATH={REPO}",
            "export PATH SLURM_CONF PYTHONPATH GPUSHARE_FAKEGPU_ROOT GPUSHARE_TELEMETRY_PROVIDER",
        ]) + "\n")
        for hook in ("prolog", "epilog"):
            self._write(self.etc / hook, "#!/bin/sh\n"
                        f"GPUSHARE_AGENT_ENV={self.etc}/gpushare-agent.env "
                        f"exec {REPO}/scripts/{hook}.sh\n", mode=0o755)
        self._write(self.slurm_conf, self._slurm_conf())
        self._write(self.etc / "gres.conf", self._gres_conf())
        self._write(self.etc / "slurmdbd.conf", self._slurmdbd_conf(), mode=0o600)
        self._write(self.etc / "my.cnf", self._my_cnf())
        self._write(self.daemon_config, self._daemon_toml())
        # The hook's settings come from the daemon's TOML, as `slurm-gpushare hook-config` does.
        hook_settings = load_config(self.daemon_config).hook_settings()
        if self._write(self.etc / "gpushare_hook.json", json.dumps(hook_settings, indent=2) + "\n"):
            # The hook reads its settings when slurmctld (re)loads the script, which it does
            # when the script's mtime changes.
            os.utime(HOOK_DIR / "job_submit.lua")
        # slurmctld reads job_submit.lua from the directory of slurm.conf; link the project's.
        for name in ("job_submit.lua", "gpushare_tres.lua"):
            link = self.etc / name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(HOOK_DIR / name)

    def _agent_delivery_env(self) -> list[str]:
        """Where the prolog/epilog agent keeps its state and how it reaches the daemon."""
        return [f"GPUSHARE_STATE_DIR={self.root}/agent", f"GPUSHARE_SOCKET={self.daemon_socket}"]

    @property
    def controller_host(self) -> str:
        """slurm.conf's SlurmctldHost."""
        return "localhost"

    def _node_address(self, index: int, node: FakeNode) -> str:
        """How slurm.conf says where a node's slurmd listens: all on this host, one port each."""
        return f"NodeHostname=localhost Port={self.ports['slurmd_base'] + index}"

    @staticmethod
    def _write(path: Path, text: str, mode: int = 0o644) -> bool:
        """Write only when the content changed (keeps mtimes); True if it changed."""
        if path.exists() and path.read_text() == text:
            os.chmod(path, mode)
            return False
        replace_atomically(path, text.encode(), mode)
        return True

    def _slurm_conf(self, *, job_submit: bool = True) -> str:
        r = self.root
        lines = [
            "# Generated by slurm-gpushare's test cluster; edits are overwritten.",
            f"ClusterName={CLUSTER_NAME}",
            f"SlurmctldHost={self.controller_host}",
            f"SlurmctldPort={self.ports['slurmctld']}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={r}/ctld",
            f"SlurmdSpoolDir={r}/spool/slurmd-%n",
            f"SlurmctldPidFile={r}/run/slurmctld.pid",
            f"SlurmdPidFile={r}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "SlurmdParameters=config_overrides",
            "ProctrackType=proctrack/linuxproc",
            f"Prolog={self.etc}/prolog",
            f"Epilog={self.etc}/epilog",
            f"TaskProlog={REPO}/scripts/taskprolog.sh",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "GresTypes=gpu,shard,mps",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=2,bf_interval=2",
            # As the admin guide asks for the SJF lever: nice weighed against age, and a base
            # above sjf_nice_max so that no penalty reaches Slurm's floor of 1.
            "PriorityType=priority/multifactor",
            "PriorityWeightAge=1000",
            "PriorityMaxAge=7-0",
            "PriorityWeightPartition=50000",
            "ReturnToService=2",
            "InactiveLimit=0",
            "KillWait=5",
            "MinJobAge=600",
            "MaxJobCount=100000",
            "SlurmdTimeout=60",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=localhost",
            f"AccountingStoragePort={self.ports['slurmdbd']}",
            # 22.05 authenticates to slurmdbd with the munge socket named here, not AuthInfo's.
            f"AccountingStoragePass={self.munge_socket}",
            "AccountingStorageTRES=gres/gpu,gres/shard,gres/mps",
        ]
        if job_submit:
            lines.append("JobSubmitPlugins=lua")
        for index, node in enumerate(self.nodes):
            lines.append(
                f"NodeName={node.name} {self._node_address(index, node)} "
                f"CPUs={node.cpus} RealMemory=8000 "
                f"Gres=gpu:{node.gpu_type}:{node.gpus},{node.sharing}:{node.sharing_count} "
                f"Features={node.features} State=UNKNOWN"
            )
        lines += [
            "PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "PartitionName=gpu-excl Nodes=ALL MaxTime=INFINITE State=UP",
            # Sharing on, but only some GPU types: a rewrite must not name the others.
            "PartitionName=gpu-v100 Nodes=v100-[1-2] MaxTime=INFINITE State=UP",
        ]
        return "\n".join(lines) + "\n"

    def _gres_conf(self) -> str:
        lines = ["# Generated by slurm-gpushare's test cluster: fake GPUs on plain files.",
                 "AutoDetect=off"]
        for node in self.nodes:
            last = node.gpus - 1
            lines.append(f"NodeName={node.name} Name=gpu Type={node.gpu_type} "
                         f"File={self.root}/dev/{node.name}/nvidia[0-{last}]")
            # One shard = 1 GiB (or 100 MPS percent per GPU), spread evenly over its GPUs.
            lines.append(f"NodeName={node.name} Name={node.sharing} Count={node.sharing_count}")
        return "\n".join(lines) + "\n"

    def _slurmdbd_conf(self) -> str:
        r = self.root
        return "\n".join([
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "DbdHost=localhost",
            f"DbdPort={self.ports['slurmdbd']}",
            "SlurmUser=root",
            f"PidFile={r}/run/slurmdbd.pid",
            f"LogFile={r}/log/slurmdbd.log",
            "DebugLevel=info",
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",
            f"StoragePort={self.ports['mariadb']}",
            "StorageUser=slurm",
            "StoragePass=gpushare-test",
            "StorageLoc=slurm_acct_db",
        ]) + "\n"

    def _my_cnf(self) -> str:
        r = self.root
        return "\n".join([
            "[mariadbd]",
            f"datadir={r}/mysql",
            f"socket={r}/mysql-run/mysqld.sock",
            f"pid-file={r}/mysql-run/mysqld.pid",
            f"log-error={r}/mysql-run/mysqld.log",
            f"port={self.ports['mariadb']}",
            "bind-address=127.0.0.1",
            "user=mysql",
            "skip-name-resolve",
            "innodb_buffer_pool_size=64M",
            "innodb_log_file_size=16M",
            "innodb_flush_log_at_trx_commit=2",
            "",
            "[client]",
            f"socket={r}/mysql-run/mysqld.sock",
        ]) + "\n"

    def _daemon_toml(self) -> str:
        types = "\n".join(
            f'[gpu_types.{t}]\nmemory_gib = {m}\nfeature = "{t}"\nmodel = "{GPU_MODELS[t]}"\n'
            f'sharing = "{sharing}"\n'
            for t, m, sharing in sorted({(n.gpu_type, n.memory_gib, n.sharing) for n in self.nodes})
        )
        return (
            "# Generated by slurm-gpushare's test cluster.\n"
            "[daemon]\n"
            f'socket = "{self.daemon_socket}"\n'
            f'query_socket = "{self.run}/gpushare-query.sock"\n'
            f'cluster_name = "{CLUSTER_NAME}"\n'
            f'log_file = "{self.log}/gpushare.log"\n'
            f'state_dir = "{self.root}/predictor"\n'
            f'secret_file = "{self.root}/predictor/secret"\n\n'
            "[policy]\n"
            'sharing_partitions = ["gpu", "gpu-v100"]\n'
            'first_run = "whole-gpu"\n'
            "default_share_gib = 8\n"
            "# Shares on an idle cluster, so tests see how jobs are sized; the burst test turns\n"
            "# the default (share only under pressure) back on.\n"
            "keep_whole_when_idle = false\n"
            '# The SJF lever, so tests can read the nice it sets in scontrol show job.\n'
            'priority = "sjf"\n\n'
            "[hook]\n"
            "timeout_ms = 50\n"
            "breaker_failures = 3\n"
            "breaker_cooldown_s = 5.0  # short, so tests see the breaker close again\n\n"
            f"{types}"
        )

    # ---- components ------------------------------------------------------------------------
    def _pid_file(self, name: str) -> Path:
        folder = self.root / "mysql-run" if name == "mysqld" else self.run
        return folder / f"{name}.pid"

    def _pid(self, name: str) -> int | None:
        pid = _pid_alive(self._pid_file(name))
        if pid is None and name.startswith(_SLURM_DAEMONS):
            # 24.11's slurmd and slurmctld restart themselves on reconfigure: for a moment the
            # pid file names the process that has exited while its successor runs.
            pid = next(iter(self._slurm_processes().get(name, [])), None)
        return pid

    def _slurm_processes(self) -> dict[str, list[int]]:
        """This cluster's Slurm daemons as /proc shows them (told apart from other clusters'
        by their SLURM_CONF), by component name (``slurmctld``, ``slurmd-<node>``, ...)."""
        mine = f"SLURM_CONF={self.slurm_conf}".encode()
        found: dict[str, list[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                argv = Path("/proc", entry, "cmdline").read_bytes().split(b"\0")
                if os.path.basename(argv[0]).decode(errors="replace") not in _SLURM_DAEMONS:
                    continue
                if mine not in Path("/proc", entry, "environ").read_bytes().split(b"\0"):
                    continue
            except OSError:  # gone meanwhile, or not ours to read
                continue
            name = os.path.basename(argv[0]).decode()
            if name == "slurmd":
                if b"-N" not in argv[:-1]:
                    continue
                name = f"slurmd-{argv[argv.index(b'-N') + 1].decode(errors='replace')}"
            found.setdefault(name, []).append(int(entry))
        return found

    def _spawn(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> None:
        """Start a daemon that forks into the background itself (or writes its own pid file)."""
        with open(self.log / f"{name}.out", "ab") as out:
            result = subprocess.run(argv, env=env or self.env(), stdout=out, stderr=out,
                                    stdin=subprocess.DEVNULL, timeout=60)
        if result.returncode != 0:
            raise ClusterError(f"{name} failed to start (exit {result.returncode}); "
                               f"see {self.log / (name + '.out')}")

    def _start_munge(self) -> None:
        key = self.root / "munge" / "munge.key"
        if not key.exists():
            subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True,
                           capture_output=True)
            os.chmod(key, 0o600)
        if not self._pid("munged"):
            self._spawn("munged", [
                "munged", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
                f"--pid-file={self.run}/munged.pid", f"--log-file={self.log}/munged.log",
                f"--seed-file={self.root}/munge/munged.seed",
            ])
        _wait_until(self._munge_ok, 15, "munged")

    def _munge_ok(self, socket: Path | None = None) -> bool:
        socket = socket or self.munge_socket
        cred = subprocess.run(["munge", "-n", "-S", str(socket)], capture_output=True, timeout=5)
        if cred.returncode:
            return False
        return subprocess.run(["unmunge", "-S", str(socket)], input=cred.stdout,
                              capture_output=True, timeout=5).returncode == 0

    def _mysql(self, sql: str) -> subprocess.CompletedProcess:
        return subprocess.run(["mariadb", f"--defaults-file={self.etc}/my.cnf", "-uroot", "-e", sql],
                              capture_output=True, text=True, timeout=30)

    def _start_mariadb(self) -> None:
        datadir, rundir = self.root / "mysql", self.root / "mysql-run"
        rundir.mkdir(exist_ok=True)
        for path in (datadir, rundir):  # mariadbd runs as mysql
            shutil.chown(path, "mysql", "mysql")
        if not (datadir / "mysql").exists():
            result = subprocess.run(
                ["mariadb-install-db", f"--defaults-file={self.etc}/my.cnf", "--skip-test-db",
                 "--auth-root-authentication-method=socket"],
                capture_output=True, text=True, timeout=120)
            if result.returncode:
                raise ClusterError(f"mariadb-install-db failed: {result.stderr.strip()[-400:]}")
        if not _pid_alive(rundir / "mysqld.pid"):
            with open(self.log / "mariadb.out", "ab") as out:
                subprocess.Popen(["mariadbd", f"--defaults-file={self.etc}/my.cnf"],
                                 stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        _wait_until(lambda: self._mysql("SELECT 1").returncode == 0, 60, "MariaDB")
        grant = self._mysql(
            "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'gpushare-test';"
            "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';")
        if grant.returncode:
            raise ClusterError(f"MariaDB grant failed: {grant.stderr.strip()}")

    def _start_slurmdbd(self) -> None:
        if not self._pid("slurmdbd"):
            self._spawn("slurmdbd", self.in_root(["slurmdbd"]))
        _wait_until(lambda: self.slurm("sacctmgr", "-n", "list", "cluster", check=False,
                                       timeout=10).returncode == 0, 60, "slurmdbd")
        clusters = self.slurm("sacctmgr", "-n", "-P", "list", "cluster", "format=cluster").stdout
        if CLUSTER_NAME not in clusters.split():
            self.slurm("sacctmgr", "-i", "add", "cluster", CLUSTER_NAME)

    def _start_slurmctld(self) -> None:
        if not self._pid("slurmctld"):
            self._spawn("slurmctld", self.in_root(["slurmctld"]))
        _wait_until(lambda: "UP" in self.slurm("scontrol", "ping", check=False, timeout=10).stdout,
                    60, "slurmctld")

    def _start_slurmds(self) -> None:
        for node in self.nodes:
            if not self._pid(f"slurmd-{node.name}"):
                self._spawn(f"slurmd-{node.name}", self.in_root(["slurmd", "-N", node.name]))
        _wait_until(self.nodes_ready, 60, "all slurmd to register")

    def nodes_ready(self) -> bool:
        out = self.slurm("sinfo", "-h", "-N", "-o", "%N %t", check=False, timeout=10).stdout
        states = dict(line.split() for line in out.splitlines() if line.strip())
        ready = {"idle", "mix", "alloc"}
        return all(states.get(node.name) in ready for node in self.nodes)

    def start_daemon(self) -> None:
        if self.daemon_pid():
            return
        with open(self.log / "gpushare.out", "ab") as out:
            proc = subprocess.Popen(
                [self.python, "-m", "slurm_gpushare", "serve", "--config", str(self.daemon_config)],
                stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True,
                cwd=str(REPO), env={**self.env(), "PYTHONPATH": str(REPO)})
        (self.run / "gpushare.pid").write_text(f"{proc.pid}\n")

        def answering() -> bool:
            if proc.poll() is not None:
                raise ClusterError(f"predictor daemon exited; see {self.log}/gpushare.out")
            from slurm_gpushare.daemon.protocol import request as request_once
            return request_once(str(self.daemon_socket), {"v": 1, "op": "ping"}, 1)["ok"]

        _wait_until(answering, 90, "the predictor daemon")  # slow on a loaded machine

    def daemon_pid(self) -> int | None:
        return self._pid("gpushare")

    def stop_daemon(self) -> None:
        self._terminate("gpushare")

    def restart_daemon(self) -> None:
        """Restart the predictor daemon (new code or config) and wait until the hook uses it."""
        self.stop_daemon()
        self.start_daemon()
        self.wait_hook()

    def prepare_root(self) -> float | None:
        """24.11: build the trixie root if missing (seconds taken, or None) and write the
        scripts that enter it."""
        if not self.slurm_root:
            return None
        self.log.mkdir(parents=True, exist_ok=True)
        try:
            built = self.slurm_root.ensure(self.log / "slurm-root.out")
        except RootError as exc:
            raise ClusterError(str(exc)) from None
        self.slurm_root.write_entry(self.enter, self.client_bin, self.hosts_file)
        return built

    @property
    def hosts_file(self) -> Path:
        """The ``/etc/hosts`` Slurm reads inside the 24.11 root: this host's."""
        return Path("/etc/hosts")

    def start(self) -> None:
        """Bring every component up; components already running are left as they are."""
        self.root_build_seconds = self.prepare_root()
        self.write_config()
        self._start_munge()
        self._start_mariadb()
        self._start_slurmdbd()
        self.start_daemon()
        self._start_slurmctld()
        self._start_slurmds()
        self.wait_view(since=time.time())
        self.wait_hook()

    def wait_view(self, since: float, timeout: float = 60) -> None:
        """Poll until the daemon has read the nodes from Slurm after ``since`` (when every
        slurmd had registered): until its next refresh it still sees them as they were while
        they registered (not responding, or missing), and keeps jobs it would share."""
        from slurm_gpushare.daemon.protocol import request as request_once

        def current() -> bool:
            view = request_once(str(self.daemon_socket), {"v": 1, "op": "ping"}, 2).get("view")
            return bool(view) and (view.get("refreshed_at") or 0) >= since

        _wait_until(current, timeout, "the daemon to read the registered nodes", interval=0.2)

    def wait_hook(self, timeout: float = 60) -> None:
        """Poll until slurmctld's hook gets answers from the daemon again (its circuit breaker
        may still be open after a daemon restart): a held probe job must come back tagged."""

        def tagged() -> bool:
            job_id = self.sbatch("--hold", "--gres=gpu:1", "--comment=gpushare:mem=1G",
                                 "--job-name=gpushare-probe", script="#!/bin/sh\ntrue\n")
            comment = self.job(job_id).get("AdminComment", "")
            self.slurm("scancel", job_id, check=False)
            return comment.startswith("gpushare:")

        _wait_until(tagged, timeout, "the hook to reach the daemon", interval=0.5)

    def _terminate(self, name: str, timeout: float = 30) -> None:
        pid = self._pid(name)
        if pid:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                _wait_until(lambda: not _pid_alive(self._pid_file(name)), timeout,
                            f"{name} to stop")
            except ClusterError:
                os.kill(pid, signal.SIGKILL)
        self._pid_file(name).unlink(missing_ok=True)

    def stop(self) -> None:
        """Stop every component (jobs still queued are kept in the state directory)."""
        for node in self.nodes:
            self._terminate(f"slurmd-{node.name}")
        self._terminate("slurmctld")
        self._terminate("gpushare")
        self._terminate("slurmdbd")
        self._terminate("mysqld", timeout=60)
        self._terminate("munged")
        self._stop_strays()

    def cancel_jobs(self, timeout: float = 60) -> int:
        """Cancel every job and wait for them to leave the queue, while slurmd still runs to end
        their steps (a step whose slurmd stopped under it lingers, deaf to SIGTERM): for the end of
        a test run, which must leave no process behind. The number of jobs cancelled."""
        if not self._pid("slurmctld"):
            return 0
        def queued() -> list[str]:
            return self.slurm("squeue", "-h", "-o", "%i", check=False).stdout.split()

        ids = queued()
        if ids:
            self.slurm("scancel", *ids, check=False)
            _wait_until(lambda: not queued(), timeout, "the cancelled jobs to end")
        return len(ids)

    def _stop_strays(self, timeout: float = 15) -> None:
        """Stop any Slurm daemon of this cluster that no pid file named (one a restart left
        behind), so the next start meets none."""
        strays = [pid for pids in self._slurm_processes().values() for pid in pids]
        for pid in strays:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            _wait_until(lambda: not self._slurm_processes(), timeout, "stray Slurm daemons to stop")
        except ClusterError:
            for pid in [pid for pids in self._slurm_processes().values() for pid in pids]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def status(self) -> dict[str, bool]:
        names = ["munged", "mysqld", "slurmdbd", "gpushare", "slurmctld"]
        names += [f"slurmd-{n.name}" for n in self.nodes]
        return {name: bool(self._pid(name)) for name in names}

    def set_job_submit(self, enabled: bool) -> None:
        """Turn JobSubmitPlugins=lua on or off (for benchmarks) and make slurmctld re-read it.

        JobSubmitPlugins is only read at start, so slurmctld is restarted (state is kept).
        """
        self._write(self.slurm_conf, self._slurm_conf(job_submit=enabled))
        self._terminate("slurmctld")
        self._start_slurmctld()
        _wait_until(self.nodes_ready, 60, "nodes after slurmctld restart")

    # ---- jobs ------------------------------------------------------------------------------
    def sbatch(self, *args: str, script: str = "#!/bin/sh\nsleep 1\n", check: bool = True,
               env: dict[str, str] | None = None) -> str:
        """Submit a batch job; returns its id."""
        result = self.slurm("sbatch", "--parsable", f"--chdir={self.root}/jobs",
                            f"--output={self.root}/jobs/%j.out", *args, input=script,
                            check=check, env=env)
        return result.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (one job, key=value pairs)."""
        out = self.slurm("scontrol", "-o", "show", "job", job_id).stdout
        fields: dict[str, str] = {}
        for token in out.split():
            if "=" in token:
                key, value = token.split("=", 1)
                fields[key] = value
        return fields

    def wait_state(self, job_id: str, states: set[str], timeout: float = 60) -> str:
        seen = {}

        def reached() -> bool:
            seen["state"] = self.job(job_id).get("JobState", "")
            return seen["state"] in states

        try:
            _wait_until(reached, timeout, f"job {job_id} to reach {sorted(states)}",
                        interval=0.25)
        except ClusterError:  # say where it was (the message above is made before waiting)
            job = self.job(job_id)
            raise ClusterError(
                f"timed out after {timeout:.0f}s waiting for job {job_id} to reach "
                f"{sorted(states)}: JobState={job.get('JobState')} Reason={job.get('Reason')} "
                f"ReqNodeList={job.get('ReqNodeList')} NodeList={job.get('NodeList')}") from None
        return seen["state"]

    def job_output(self, job_id: str) -> str:
        """A batch job's output file (``sbatch`` here writes it under jobs/), or "" if none."""
        path = self.root / "jobs" / f"{job_id}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_completed(self, job_id: str, timeout: float = 90) -> None:
        """Wait until the job ends; one that does not complete fails with its state, exit code,
        node and the tail of its output, so a failure in CI says why."""
        state = self.wait_state(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                         "OUT_OF_MEMORY", "NODE_FAIL"}, timeout=timeout)
        if state != "COMPLETED":
            job = self.job(job_id)
            raise ClusterError(
                f"job {job_id} ended {state} (ExitCode={job.get('ExitCode')} "
                f"Reason={job.get('Reason')} NodeList={job.get('NodeList')}); its output ends:\n"
                + "\n".join(self.job_output(job_id).splitlines()[-15:]))

    def sacct(self, job_id: str, fields: str, timeout: float = 30) -> dict[str, str]:
        """One job's accounting record (its allocation line) from slurmdbd, polled until there."""
        record: dict[str, str] = {}

        def stored() -> bool:
            out = self.slurm("sacct", "-n", "-P", "-X", "-j", job_id, "-o", fields,
                             env={"SLURM_TIME_FORMAT": "%s"}).stdout
            lines = [line for line in out.splitlines() if line]
            if not lines:
                return False
            names = fields.split(",")
            # The last field may itself contain "|" (free text): split only as far as needed.
            record.update(zip(names, lines[0].split("|", len(names) - 1)))
            return record.get("State", "") not in ("PENDING", "RUNNING", "")

        _wait_until(stored, timeout, f"accounting for job {job_id}", interval=0.5)
        return record


# ---- CLI -------------------------------------------------------------------------------------

def make_cluster(state_dir=None, **kwargs) -> TestCluster:
    """The test cluster of ``$GPUSHARE_CLUSTER_MODE`` (single-host unless it says multihost)."""
    from devcluster.multihost import make_cluster as make

    return make(state_dir, **kwargs)


@click.group("cluster")
def cluster_group() -> None:
    """The local test cluster (real Slurm daemons, fake GPUs) under $GPUSHARE_CLUSTER_DIR."""


@cluster_group.command("start")
def cluster_start() -> None:
    """Start (or complete) the local test cluster."""
    cluster = make_cluster()
    started = time.monotonic()
    cluster.start()
    if cluster.root_build_seconds is not None:
        click.echo(f"built the Slurm {cluster.slurm_version} root in "
                   f"{cluster.root_build_seconds:.0f}s")
    exports = " ".join(f"{k}={v}" for k, v in cluster.client_environ().items())
    click.echo(f"Slurm {cluster.slurm_version} test cluster up in "
               f"{time.monotonic() - started:.1f}s; export {exports}")


@cluster_group.command("prepare")
def cluster_prepare() -> None:
    """Build what the cluster needs before it can start (on 24.11: the trixie root), start
    nothing. A start meanwhile waits for the build."""
    cluster = make_cluster()
    built = cluster.prepare_root()
    click.echo(f"Slurm {cluster.slurm_version}: " + (
        "nothing to build" if cluster.slurm_root is None else
        "root already built" if built is None else f"built the root in {built:.0f}s"))


@cluster_group.command("stop")
@click.option("--cancel-jobs", is_flag=True,
              help="cancel every job first and wait for them to end (the end of a test run); "
                   "without it, jobs are kept in the state directory and running steps left alone")
def cluster_stop(cancel_jobs: bool) -> None:
    """Stop every component of the local test cluster."""
    cluster = make_cluster()
    if cancel_jobs:
        try:
            count = cluster.cancel_jobs()
        except ClusterError as exc:
            click.echo(f"warning: {exc}; stopping anyway", err=True)
        else:
            click.echo(f"cancelled {count} job(s)" if count else "no jobs left")
    cluster.stop()
    click.echo("test cluster stopped")


@cluster_group.command("status")
@click.option("--json", "as_json", is_flag=True)
def cluster_status(as_json: bool) -> None:
    """Show which components are running; exit 1 unless all are."""
    status = make_cluster().status()
    if as_json:
        click.echo(json.dumps(status))
    else:
        for name, up in status.items():
            click.echo(f"{name:16} {'up' if up else 'down'}")
    if not all(status.values()):
        raise click.exceptions.Exit(1)


@cluster_group.command("env")
def cluster_env() -> None:
    """Print the environment line to use the cluster's Slurm clients from a shell."""
    environ = make_cluster().client_environ()
    click.echo("export " + " ".join(f"{k}={v}" for k, v in environ.items()))



