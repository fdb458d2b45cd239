"""The daemon's configuration: one TOML file, read once, passed explicitly.

Unknown keys are errors (a typo must not silently fall back to a default). See
``etc/gpushare.toml`` for the annotated reference.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

DEFAULT_CONFIG_PATH = "/etc/slurm-gpushare/gpushare.toml"
CONFIG_ENV = "GPUSHARE_CONFIG"
FIRST_RUN_POLICIES = ("whole-gpu", "default-share")


class ConfigError(ValueError):
    """The configuration file is missing, unreadable or invalid."""


@dataclass(frozen=True)
class GpuType:
    """A GPU type as the cluster names it (gres Type= and node feature)."""

    name: str  # gres type, e.g. "a100"
    memory_gib: int  # usable memory; one shard = 1 GiB, so this is also the shard count per GPU
    feature: str = ""  # node feature naming the type; defaults to the name
    model: str = ""  # catalogue model for predictors, e.g. "A100-80GB"; defaults to the name
    # How its GPUs are shared: "shard" (1 shard = 1 GiB, no hardware limit) or "mps" (percent
    # of a GPU, memory limited by CUDA MPS). One per node: Slurm allows one of them per node.
    sharing: str = "shard"

    def __post_init__(self):
        if not self.feature:
            object.__setattr__(self, "feature", self.name)
        if not self.model:
            object.__setattr__(self, "model", self.name)


@dataclass(frozen=True)
class DaemonConfig:
    socket: str = "/run/slurm-gpushare/daemon.sock"
    # Read-only socket for users' tools (mode 0666): what-if decisions and the recorded
    # decision of one's own jobs, answered for the caller's uid only. Empty: off.
    query_socket: str = "/run/slurm-gpushare/query.sock"
    # Peers allowed to talk to the daemon besides its own uid and root (e.g. SlurmUser's uid
    # if the daemon runs as another user). The socket is mode 0600 as well.
    allowed_uids: tuple[int, ...] = ()
    max_request_bytes: int = 1 << 20
    # A client that sends nothing for this long is disconnected (the hook keeps its connection).
    idle_timeout_s: float = 300.0
    log_file: str = ""  # empty: stderr
    log_level: str = "info"
    state_dir: str = "/var/lib/slurm-gpushare"
    secret_file: str = "/etc/slurm-gpushare/secret"
    # Slurm ClusterName, recorded with job ids (job ids are unique per cluster only).
    cluster_name: str = ""
    # How often the view of running shares (squeue/sinfo) is refreshed, in the background.
    view_refresh_s: float = 5.0
    # Runs, decisions and co-runs older than this are forgotten (checked daily on the writer
    # thread; SQLite reuses the space). 0 keeps everything.
    history_retention_days: float = 730.0


@dataclass(frozen=True)
class PolicyConfig:
    # Partitions where whole-GPU requests may be turned into shares. Empty: sharing is off.
    sharing_partitions: tuple[str, ...] = ()
    # A job with no history and no memory hint: "whole-gpu" runs it on a whole GPU (profiled,
    # so its next run can share); "default-share" shares it with default_share_gib.
    first_run: str = "whole-gpu"
    # Share size for first runs under first_run = "default-share".
    default_share_gib: int = 8
    # Comment token by which a user opts a job out (sbatch --comment=gpushare=off).
    opt_out_token: str = "gpushare=off"
    # Comment token for a memory hint (sbatch --comment=gpushare:mem=12G).
    mem_hint_token: str = "gpushare:mem="
    # Headroom added on top of a memory hint, as a fraction (CUDA context, fragmentation).
    hint_margin: float = 0.10
    # GPU-time budget per GPU, in % of one GPU: a share also takes that part of the GPU's
    # shards that its peak utilisation is of this budget, so co-runners' utilisations cannot
    # add up past it (Slurm enforces it with the shard counts). 0 sizes by memory only.
    gpu_time_budget_pct: float = 100.0
    # A running share seen above its memory (shards set no hardware limit): "log" it, or also
    # "requeue" the job (scontrol requeue), so its co-runners keep their memory.
    on_share_exceeded: str = "log"


@dataclass(frozen=True)
class HookConfig:
    """Settings the Lua hook reads (written to gpushare_hook.json by ``hook-config``)."""

    timeout_ms: int = 50
    breaker_failures: int = 3  # consecutive failures that open the circuit breaker
    breaker_cooldown_s: float = 30.0  # how long jobs pass untouched before probing again
    max_script_bytes: int = 65536  # script bytes sent for the keyed digest (never stored)


@dataclass(frozen=True)
class Config:
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    hook: HookConfig = field(default_factory=HookConfig)
    gpu_types: tuple[GpuType, ...] = ()
    path: str = ""

    def gpu_type(self, name: str) -> GpuType | None:
        for gpu in self.gpu_types:
            if gpu.name == name:
                return gpu
        return None

    def hook_settings(self) -> dict[str, Any]:
        return {"socket": self.daemon.socket, **_asdict(self.hook)}


def _asdict(obj) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _section(cls, raw: dict[str, Any], where: str):
    known = {f.name: f for f in fields(cls)}
    unknown = set(raw) - set(known)
    if unknown:
        raise ConfigError(f"unknown key(s) in [{where}]: {', '.join(sorted(unknown))}")
    values = {}
    defaults = cls()
    for key, value in raw.items():
        default = getattr(defaults, key)
        if isinstance(default, tuple):
            if not isinstance(value, list):
                raise ConfigError(f"[{where}] {key} must be a list")
            value = tuple(value)
        elif isinstance(default, bool) or not isinstance(default, (int, float, str)):
            pass
        elif isinstance(default, float) and isinstance(value, int):
            value = float(value)
        elif not isinstance(value, type(default)):
            raise ConfigError(
                f"[{where}] {key} must be {type(default).__name__}, not {type(value).__name__}"
            )
        values[key] = value
    return replace(defaults, **values)


def parse_config(raw: dict[str, Any], path: str = "") -> Config:
    allowed = {"daemon", "policy", "hook", "gpu_types"}
    unknown = set(raw) - allowed
    if unknown:
        raise ConfigError(f"unknown section(s): {', '.join(sorted(unknown))}")
    gpu_types = []
    for name, spec in raw.get("gpu_types", {}).items():
        if not isinstance(spec, dict) or "memory_gib" not in spec:
            raise ConfigError(f"[gpu_types.{name}] needs memory_gib")
        extra = set(spec) - {"memory_gib", "feature", "model", "sharing"}
        if extra:
            raise ConfigError(f"unknown key(s) in [gpu_types.{name}]: {', '.join(sorted(extra))}")
        memory = spec["memory_gib"]
        if not isinstance(memory, int) or memory <= 0:
            raise ConfigError(f"[gpu_types.{name}] memory_gib must be a positive integer")
        sharing = spec.get("sharing", "shard")
        if sharing not in ("shard", "mps"):
            raise ConfigError(f"[gpu_types.{name}] sharing must be \"shard\" or \"mps\"")
        gpu_types.append(
            GpuType(name=name, memory_gib=memory, feature=spec.get("feature", ""),
                    model=spec.get("model", ""), sharing=sharing)
        )
    config = Config(
        daemon=_section(DaemonConfig, raw.get("daemon", {}), "daemon"),
        policy=_section(PolicyConfig, raw.get("policy", {}), "policy"),
        hook=_section(HookConfig, raw.get("hook", {}), "hook"),
        gpu_types=tuple(gpu_types),
        path=path,
    )
    if config.policy.on_share_exceeded not in ("log", "requeue"):
        raise ConfigError('[policy] on_share_exceeded must be "log" or "requeue"')
    if config.policy.first_run not in FIRST_RUN_POLICIES:
        raise ConfigError(f"[policy] first_run must be one of {', '.join(FIRST_RUN_POLICIES)}")
    if config.policy.default_share_gib <= 0:
        raise ConfigError("[policy] default_share_gib must be positive")
    if config.hook.timeout_ms <= 0:
        raise ConfigError("[hook] timeout_ms must be positive")
    return config


def load_config(path: str | os.PathLike | None = None) -> Config:
    """Read the TOML file at ``path`` (or $GPUSHARE_CONFIG, or the default path)."""
    path = Path(path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH)
    try:
        with open(path, "rb") as handle:
            raw = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from None
    return parse_config(raw, str(path))
