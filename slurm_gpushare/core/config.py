"""The daemon's configuration: one TOML file, read once, passed explicitly.

Unknown keys are errors (a typo must not silently fall back to a default). See
``etc/gpushare.toml`` for the annotated reference.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

DEFAULT_CONFIG_PATH = "/etc/slurm-gpushare/gpushare.toml"
CONFIG_ENV = "GPUSHARE_CONFIG"
FIRST_RUN_POLICIES = ("whole-gpu", "default-share")
PRIORITY_LEVERS = ("none", "sjf")
# One shard of GPU memory, in MiB ([shares] shard_mib). 1 GiB by default: finer shards cut the
# rounding but let cross-type estimates fall under the real peak (bench/shard_granularity.py).
DEFAULT_SHARD_MIB = 1024
# Largest nice the hook may set either way (Slurm's own limit is 2^31 - 3; the hook checks this).
MAX_NICE = 1_000_000


class ConfigError(ValueError):
    """The configuration file is missing, unreadable or invalid."""


@dataclass(frozen=True)
class GpuType:
    """A GPU type as the cluster names it (gres Type= and node feature)."""

    name: str  # gres type, e.g. "a100"
    memory_gib: int  # usable memory; shards per GPU = memory_gib x 1024 / shard_mib
    feature: str = ""  # node feature naming the type; defaults to the name
    model: str = ""  # catalogue model for predictors, e.g. "A100-80GB"; defaults to the name
    # How its GPUs are shared: "shard" (1 shard = shard_mib of memory, no hardware limit) or
    # "mps" (percent of a GPU, memory limited by CUDA MPS). One per node: Slurm allows one.
    sharing: str = "shard"
    # The site's shard size ([shares] shard_mib, the same on every type so that one shard
    # count means the same memory everywhere); set by parse_config.
    shard_mib: int = DEFAULT_SHARD_MIB

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
    # Once a request line has begun, all of it must arrive within this (slow senders dropped).
    request_timeout_s: float = 2.0
    # Open connections on the main socket (slurmctld, agents, admins); one more is refused.
    max_connections: int = 256
    # The query socket (any local user): open connections in all, per user, request size and
    # requests per second per user.
    query_max_connections: int = 64
    query_connections_per_uid: int = 4
    query_max_request_bytes: int = 65536
    query_rate_per_s: float = 20.0
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
    # TCP listener for compute nodes' agents ("ADDR:PORT", e.g. "0.0.0.0:6830"); empty: off.
    # It takes only munge-sealed telemetry deliveries (daemon/netlistener.py).
    listen_tcp: str = ""
    # uids whose munge credentials may deliver over TCP; empty: root and SlurmUser.
    tcp_allowed_uids: tuple[int, ...] = ()
    # munged's socket for verifying credentials; empty: munge's default.
    munge_socket: str = ""


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
    # add up past it (Slurm enforces it with the shard counts). 0 (the default) sizes by memory
    # only: a shard count then means the same on every type, and which jobs may share a GPU is
    # the interference model's call (node exclusion). A peak utilisation is a poor proxy for
    # interference (busy jobs can pair well, idle-looking ones badly), so it is off by default.
    gpu_time_budget_pct: float = 0.0
    # Share only under pressure: a job that would share keeps its whole GPU while a GPU of a
    # type it fits on is idle (the daemon's view of the cluster). false: share whenever it fits.
    keep_whole_when_idle: bool = True
    # Pessimism for the pair predictor, at least this factor on every predicted slowdown
    # (a pair shares a GPU when each job's 1 / (1 + margin x slowdown) stays >= 0.7). 0 (the
    # default) uses the calibrated margins (1.45 cold, 1.25 with co-run history, from NVML
    # measurements); 2.1 is what Ray et al.'s P100 pairs ask for, whose host-bound jobs slowed
    # each other more than their GPU telemetry shows.
    pair_margin: float = 0.0
    # A running share seen above its memory (shards set no hardware limit): "log" it, or also
    # "requeue" the job (scontrol requeue), so its co-runners keep their memory.
    on_share_exceeded: str = "log"
    # Requeues of one job for going above its share (each re-sized to its peak + hint_margin,
    # or a whole GPU); after that it is left to run.
    max_requeues: int = 2
    # Queue order: "none" leaves the job's nice alone; "sjf" sets it from the job's predicted
    # run time (its own history only), so that multifactor priority starts short jobs first
    # while age and fair-share keep working (docs/admin-guide.md, "Shortest job first").
    priority: str = "none"
    # Partitions where the priority lever applies; empty: the sharing partitions.
    priority_partitions: tuple[str, ...] = ()
    # nice = sjf_nice_per_decade x log10(predicted run time / sjf_reference_s), within
    # +-sjf_nice_max: shorter than the reference gets a boost, longer a penalty. The default
    # puts the predicted run time first: with PriorityWeightAge=1000, age never makes up a
    # factor of ten, and orders only jobs of about the same predicted length. That is what
    # shortens mean and p95 JCT in the simulator (docs/admin-guide.md, "Shortest job first",
    # has the measured strengths); lower it where long jobs must catch up by waiting. The
    # bound spans four decades either way; give every job a base priority above it
    # (check-config says how), or Slurm's floor of 1 makes the longest jobs tie.
    sjf_reference_s: float = 3600.0
    sjf_nice_per_decade: int = 10000
    sjf_nice_max: int = 40000


@dataclass(frozen=True)
class SharesConfig:
    # MiB of GPU memory in one gres/shard, on every GPU type: gres.conf Count per GPU is
    # memory_gib x 1024 / shard_mib (gen-config writes it, check-config checks it).
    shard_mib: int = DEFAULT_SHARD_MIB


@dataclass(frozen=True)
class HookConfig:
    """Settings the Lua hook reads (written to gpushare_hook.json by ``hook-config``)."""

    timeout_ms: int = 50
    breaker_failures: int = 3  # consecutive failures that open the circuit breaker
    # How long jobs pass untouched before the hook asks again: breaker_first_cooldown_s when
    # the breaker opens, doubled each time it opens again soon after closing (or its probe
    # fails), up to breaker_cooldown_s. A restart of the daemon costs about the first.
    breaker_cooldown_s: float = 30.0
    breaker_first_cooldown_s: float = 1.0
    # The breaker also opens when, over the last breaker_window answers, at least
    # breaker_failure_rate of them failed or their mean latency exceeded breaker_slow_ms.
    # Only the daemon's health counts (timeouts, connection errors, unreadable replies),
    # never a job's own refusal.
    breaker_window: int = 20
    breaker_failure_rate: float = 0.5
    breaker_slow_ms: float = 20.0
    max_script_bytes: int = 65536  # script bytes sent for the keyed digest (never stored)
    max_reply_bytes: int = 65536  # a longer reply line is unreadable (bounded Lua memory)


@dataclass(frozen=True)
class Config:
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    hook: HookConfig = field(default_factory=HookConfig)
    shares: SharesConfig = field(default_factory=SharesConfig)
    gpu_types: tuple[GpuType, ...] = ()
    path: str = ""

    def gpu_type(self, name: str) -> GpuType | None:
        for gpu in self.gpu_types:
            if gpu.name == name:
                return gpu
        return None

    def hook_settings(self) -> dict[str, Any]:
        # max_share_count: the most shards (or MPS percent) one GPU has; a larger count in a
        # decision cannot be valid here and the hook refuses it.
        counts = [100 if g.sharing == "mps" else shards_per_gpu(g) for g in self.gpu_types]
        return {"socket": self.daemon.socket, **_asdict(self.hook),
                "max_share_count": max(counts, default=100)}


def shards_per_gpu(gpu_type: GpuType) -> int:
    """gres/shard Count of one GPU of this type."""
    return gpu_type.memory_gib * 1024 // gpu_type.shard_mib


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
        elif isinstance(default, bool):
            # A quoted "false" would read as true: the opposite of what was meant.
            if not isinstance(value, bool):
                raise ConfigError(f"[{where}] {key} must be true or false, "
                                  f"not {type(value).__name__}")
        elif not isinstance(default, (int, float, str)):
            pass
        elif isinstance(default, (int, float)) and isinstance(value, bool):
            raise ConfigError(f"[{where}] {key} must be a number, not true or false")
        elif isinstance(default, float) and isinstance(value, (int, float)):
            if not math.isfinite(value):
                raise ConfigError(f"[{where}] {key} must be a finite number, not {value}")
            value = float(value)
        elif not isinstance(value, type(default)):
            raise ConfigError(
                f"[{where}] {key} must be {type(default).__name__}, not {type(value).__name__}"
            )
        values[key] = value
    return replace(defaults, **values)


# Gres type and node feature names: what Slurm's constraint and gres syntax keep whole.
_SLURM_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
# A bound on one GPU's memory far above any GPU's (a typo would size shard counts absurdly).
MAX_GPU_MEMORY_GIB = 4096


def _hook_section(raw: dict[str, Any]) -> HookConfig:
    hook = _section(HookConfig, raw, "hook")
    if "breaker_first_cooldown_s" not in raw and "breaker_cooldown_s" in raw:
        # A file from before the first cooldown existed, with a shorter longest one: still valid.
        hook = replace(hook, breaker_first_cooldown_s=min(hook.breaker_first_cooldown_s,
                                                          hook.breaker_cooldown_s))
    return hook


def parse_config(raw: dict[str, Any], path: str = "") -> Config:
    allowed = {"daemon", "policy", "hook", "shares", "gpu_types"}
    unknown = set(raw) - allowed
    if unknown:
        raise ConfigError(f"unknown section(s): {', '.join(sorted(unknown))}")
    shares = _section(SharesConfig, raw.get("shares", {}), "shares")
    if not MIN_SHARD_MIB <= shares.shard_mib <= MAX_SHARD_MIB:
        raise ConfigError(f"[shares] shard_mib = {shares.shard_mib} is out of range "
                          f"({MIN_SHARD_MIB} to {MAX_SHARD_MIB})")
    gpu_types = []
    for name, spec in raw.get("gpu_types", {}).items():
        if not _SLURM_NAME.fullmatch(name):
            raise ConfigError(f"[gpu_types.{name}]: {name!r} must be a Slurm gres type name "
                              "(letters, digits, _ . -)")
        if not isinstance(spec, dict) or "memory_gib" not in spec:
            raise ConfigError(f"[gpu_types.{name}] needs memory_gib")
        extra = set(spec) - {"memory_gib", "feature", "model", "sharing"}
        if extra:
            raise ConfigError(f"unknown key(s) in [gpu_types.{name}]: {', '.join(sorted(extra))}")
        memory = spec["memory_gib"]
        if (isinstance(memory, bool) or not isinstance(memory, int)
                or not 0 < memory <= MAX_GPU_MEMORY_GIB):
            raise ConfigError(f"[gpu_types.{name}] memory_gib must be a positive integer "
                              f"(at most {MAX_GPU_MEMORY_GIB})")
        for key in ("feature", "model", "sharing"):
            if not isinstance(spec.get(key, ""), str):
                raise ConfigError(f"[gpu_types.{name}] {key} must be a string")
        if spec.get("feature") and not _SLURM_NAME.fullmatch(spec["feature"]):
            # A comma or an operator would make it a constraint no single feature satisfies.
            raise ConfigError(f"[gpu_types.{name}] feature must be one Slurm feature name "
                              f"(letters, digits, _ . -), not {spec['feature']!r}")
        sharing = spec.get("sharing", "shard")
        if sharing not in ("shard", "mps"):
            raise ConfigError(f"[gpu_types.{name}] sharing must be \"shard\" or \"mps\"")
        gpu_types.append(
            GpuType(name=name, memory_gib=memory, feature=spec.get("feature", ""),
                    model=spec.get("model", ""), sharing=sharing, shard_mib=shares.shard_mib)
        )
        if sharing == "shard" and memory * 1024 < shares.shard_mib:
            raise ConfigError(f"[gpu_types.{name}] has less memory than one shard "
                              f"([shares] shard_mib = {shares.shard_mib})")
    config = Config(
        daemon=_section(DaemonConfig, raw.get("daemon", {}), "daemon"),
        policy=_section(PolicyConfig, raw.get("policy", {}), "policy"),
        hook=_hook_section(raw.get("hook", {})),
        shares=shares,
        gpu_types=tuple(gpu_types),
        path=path,
    )
    if config.policy.on_share_exceeded not in ("log", "requeue"):
        raise ConfigError('[policy] on_share_exceeded must be "log" or "requeue"')
    if config.policy.first_run not in FIRST_RUN_POLICIES:
        raise ConfigError(f"[policy] first_run must be one of {', '.join(FIRST_RUN_POLICIES)}")
    _check_ranges(config)
    if config.policy.priority not in PRIORITY_LEVERS:
        raise ConfigError(f"[policy] priority must be one of {', '.join(PRIORITY_LEVERS)}")
    if not 0 <= config.policy.sjf_nice_max <= MAX_NICE:
        raise ConfigError(f"[policy] sjf_nice_max must be between 0 and {MAX_NICE}")
    if config.policy.sjf_nice_per_decade < 0:
        raise ConfigError("[policy] sjf_nice_per_decade must not be negative")
    if config.policy.sjf_reference_s <= 0:
        raise ConfigError("[policy] sjf_reference_s must be positive")
    return config


# Slurm sets no cap on shards per GPU (gres.c's MAX_GRES_BITMAP = 1024 applies only to
# gres with File= that are not shared, 22.05 to 24.11); the bounds keep counts readable.
MIN_SHARD_MIB, MAX_SHARD_MIB = 64, 16384
# (section, key, lowest, highest): values outside are configuration errors, not surprises.
RANGES = (
    ("daemon", "max_request_bytes", 4096, 64 << 20),
    ("daemon", "idle_timeout_s", 1, 86400),
    ("daemon", "request_timeout_s", 0.05, 60),
    ("daemon", "max_connections", 4, 65536),
    ("daemon", "query_max_connections", 1, 65536),
    ("daemon", "query_connections_per_uid", 1, 1024),
    ("daemon", "query_max_request_bytes", 4096, 64 << 20),
    ("daemon", "query_rate_per_s", 0.1, 100000),
    ("daemon", "view_refresh_s", 0.5, 3600),
    ("policy", "default_share_gib", 1, 4096),
    ("policy", "hint_margin", 0, 10),
    ("policy", "gpu_time_budget_pct", 0, 100),
    ("policy", "pair_margin", 0, 6),
    ("policy", "max_requeues", 0, 100),
    # slurmctld holds its locks while the hook waits: a second is already far too long.
    ("hook", "timeout_ms", 1, 1000),
    ("hook", "breaker_failures", 1, 1000),
    ("hook", "breaker_cooldown_s", 0.1, 86400),
    ("hook", "breaker_first_cooldown_s", 0.1, 86400),
    ("hook", "breaker_window", 2, 1000),
    ("hook", "breaker_failure_rate", 0.01, 1),
    ("hook", "breaker_slow_ms", 1, 1000),
    ("hook", "max_script_bytes", 0, 64 << 20),
    ("hook", "max_reply_bytes", 1024, 16 << 20),
    ("daemon", "history_retention_days", 0, 36500),
)


def _check_ranges(config: Config) -> None:
    for section, key, low, high in RANGES:
        value = getattr(getattr(config, section), key)
        if not low <= value <= high:
            raise ConfigError(f"[{section}] {key} = {value} is out of range ({low} to {high})")
    if config.hook.breaker_first_cooldown_s > config.hook.breaker_cooldown_s:
        raise ConfigError(f"[hook] breaker_first_cooldown_s = {config.hook.breaker_first_cooldown_s}"
                          f" is longer than breaker_cooldown_s = {config.hook.breaker_cooldown_s}"
                          " (the longest cooldown)")
    if config.daemon.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ConfigError("[daemon] log_level must be debug, info, warning, error or critical")
    for key in ("allowed_uids", "tcp_allowed_uids"):
        for uid in getattr(config.daemon, key):
            if isinstance(uid, bool) or not isinstance(uid, int) or not 0 <= uid < 2**32:
                raise ConfigError(f"[daemon] {key} must be uids (non-negative integers)")
    if config.daemon.listen_tcp:
        from slurm_gpushare.core.address import parse_address

        try:
            parse_address(config.daemon.listen_tcp, any_port=True)
        except ValueError as exc:
            raise ConfigError(f"[daemon] listen_tcp: {exc}") from None
    for key in ("opt_out_token", "mem_hint_token"):
        # Tokens are matched against the comment's words: an empty one, or one with a
        # separator in it, would match what users never wrote, or nothing at all.
        token = getattr(config.policy, key)
        if not token or re.search(r"[\s,;]", token):
            raise ConfigError(f"[policy] {key} must be one word (no spaces, commas or "
                              f"semicolons), not {token!r}")
    for key in ("socket", "query_socket"):
        # The hook (inside slurmctld) and users' tools reach them from other directories.
        path = getattr(config.daemon, key)
        if (path or key == "socket") and not os.path.isabs(path):
            raise ConfigError(f"[daemon] {key} must be an absolute path, not {path!r}")
    for name in config.policy.sharing_partitions:
        if not isinstance(name, str) or not name:
            raise ConfigError("[policy] sharing_partitions must be partition names")


def load_config(path: str | os.PathLike | None = None) -> Config:
    """Read the TOML file at ``path`` (or $GPUSHARE_CONFIG, or the default path)."""
    path = Path(path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        # utf-8-sig: an editor's byte-order mark is not part of the first line.
        raw = tomllib.loads(data.decode("utf-8-sig"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from None
    return parse_config(raw, str(path))
